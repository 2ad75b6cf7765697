"""The ports of one cell, handed out by one allocator the planner is given.

``FreePortAllocator`` hands out real ports: free ports of this host, and, for a cell placed on the
nodes of its Slurm allocation, the ports each node's instances need, bound on that node before
anything starts (``placement.bind_ports``). No port is handed out twice within the cell.

``DryRunPortAllocator`` binds nothing: every port is the placeholder the dry run prints (``$PORT``,
``$REPLICA0_PORT``, ``$PREFILL0_BOOTSTRAP_PORT``, ``$ROUTER_METRICS_PORT``...).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from agentsweep.cell import placement as placement_mod
from agentsweep.cell.placement import Placement

# A port number, or a dry run's placeholder for one.
Port = int | str

CELL_PORT_PLACEHOLDER = "$PORT"


class PortAllocator(ABC):
    """Where a plan takes its ports from; ``name`` is the port's placeholder without its ``$``."""

    dry_run: bool
    cell_port: Port  # the client's endpoint: the router's, else the cell's one engine's

    @abstractmethod
    def on_host(self, name: str, address: str) -> Port:
        """A port for something this host serves on ``address``."""

    @abstractmethod
    def reserve_on_nodes(
        self, placement: Placement, counts: Mapping[str, int], *, python: str, environ: Mapping[str, str]
    ) -> Placement:
        """Reserve ``counts[node]`` ports on each node of ``placement`` for ``on_node``; returns the
        placement with what was bound where (``Placement.bound``)."""

    @abstractmethod
    def on_node(self, name: str, node: str) -> Port:
        """One of the ports reserved on ``node``."""


class DryRunPortAllocator(PortAllocator):
    """Placeholders, bound nowhere; ``cell_port`` is ``$PORT`` unless one is given."""

    dry_run = True

    def __init__(self, cell_port: Port = CELL_PORT_PLACEHOLDER) -> None:
        self.cell_port = cell_port

    def on_host(self, name: str, address: str) -> Port:
        return f"${name}"

    def reserve_on_nodes(
        self, placement: Placement, counts: Mapping[str, int], *, python: str, environ: Mapping[str, str]
    ) -> Placement:
        return placement

    def on_node(self, name: str, node: str) -> Port:
        return f"${name}"


class FreePortAllocator(PortAllocator):
    """Ports free now: this host's found by binding ``address``, each node's reserved on that node."""

    dry_run = False

    def __init__(self, cell_port: int | None = None) -> None:
        """``cell_port``: the one the cell was given (``$PORT``), else a free one of 127.0.0.1."""
        self.cell_port = placement_mod.free_port() if cell_port is None else cell_port
        self.taken: set[int] = {self.cell_port}  # every port of this host handed out
        self._reserved: dict[str, list[int]] = {}

    def on_host(self, name: str, address: str) -> Port:
        return placement_mod.free_port(address, self.taken)

    def reserve_on_nodes(
        self, placement: Placement, counts: Mapping[str, int], *, python: str, environ: Mapping[str, str]
    ) -> Placement:
        placement = placement_mod.bind_ports(
            placement, counts, python=python, environ=environ, taken=self.taken
        )
        for node, bound in placement.bound.items():
            self._reserved.setdefault(node, []).extend(bound.ports)
        return placement

    def on_node(self, name: str, node: str) -> Port:
        left = self._reserved.get(node)
        if not left:
            raise RuntimeError(f"no port reserved on node {node} is left for {name}")
        return left.pop(0)
