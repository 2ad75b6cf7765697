"""The cell's ports come from one allocator: real ports (never one twice within the cell) or a dry run's
placeholders (bound nowhere)."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentsweep.cell.placement import Placement, Slot
from agentsweep.cell.plan import plan_cell
from agentsweep.cell.port_allocation import DryRunPortAllocator, FreePortAllocator
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR, Cell

ROUTED = {
    "exp_name": "x-r2", "engine": "sim", "hardware": "h200", "model": "m", "tp": 1, "users": 4,
    "offload": "off", "duration": 10, "traces": "t", "replicas": 2, "router": "round_robin",
    "router_program": "smg",
}  # fmt: skip
ONE_ENGINE = {**ROUTED, "exp_name": "x-one", "replicas": 1, "router": ""}
DISAGGREGATED = {
    **ROUTED, "exp_name": "x-pd", "replicas": 1, "prefill": {"tp": 1}, "decode": {"tp": 1},
}  # fmt: skip


class RepeatingSocket:
    """A socket whose binds get the ports of ``PORTS`` in turn: the kernel handing one out again."""

    ports: Iterator[int] = iter(())

    def __init__(self, *args: object) -> None:
        self.port = 0

    def bind(self, where: object) -> None:
        self.port = next(RepeatingSocket.ports)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        pass

    def __enter__(self) -> RepeatingSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture
def repeating(monkeypatch):
    def use(ports: list[int]) -> None:
        RepeatingSocket.ports = iter(ports)
        monkeypatch.setattr(socket, "socket", RepeatingSocket)

    return use


def _placement(nodes: dict[str, str], slots: list[Slot]) -> Placement:
    return Placement(
        job_id="7", nodes=list(nodes), addresses=nodes, slots=slots, gres_type="h200", node_gpus=1,
        container_args=[], vendor="none",
    )  # fmt: skip


def test_a_real_allocator_never_hands_out_a_port_twice(repeating):
    repeating([5000, 5001, 5000, 5001, 5002, 5000, 5003])
    ports = FreePortAllocator()
    assert ports.cell_port == 5000
    handed = [ports.on_host(f"P{k}_PORT", "127.0.0.1") for k in range(3)]
    assert handed == [5001, 5002, 5003]


def test_a_real_allocator_keeps_a_given_cell_port_and_avoids_it(repeating):
    repeating([8000, 8001])
    ports = FreePortAllocator(cell_port=8000)
    assert ports.cell_port == 8000 and ports.on_host("ROUTER_METRICS_PORT", "127.0.0.1") == 8001


def test_ports_reserved_on_the_cells_own_node_are_bound_here_and_never_handed_out_again(repeating):
    # node 0's reservation binds its ports at once (4001 and 4002), skipping the cell's port 4000
    repeating([4000, 4000, 4001, 4002, 4001, 4002, 4003])
    ports = FreePortAllocator()
    placement = _placement({"n0": "127.0.0.1"}, [Slot(0, "n0", "127.0.0.1", 0, 1)])
    placed = ports.reserve_on_nodes(placement, {"n0": 2}, python="PY", environ={})
    assert placed.bound["n0"].ports == [4001, 4002]
    assert [ports.on_node("R0_PORT", "n0"), ports.on_node("R0_NIXL_PORT", "n0")] == [4001, 4002]
    assert ports.on_host("ROUTER_METRICS_PORT", "127.0.0.1") == 4003
    with pytest.raises(RuntimeError, match="no port reserved on node n0 is left for R1_PORT"):
        ports.on_node("R1_PORT", "n0")


def test_ports_of_another_node_are_the_ones_its_port_step_bound(monkeypatch):
    def port_step(argv, **kwargs):
        assert (
            argv[:2] == ["srun", "--jobid=7"] and "--nodelist=n1" in argv and argv[-2:] == ["10.0.0.2", "2"]
        )
        reply = {"node": "n1", "step": "7.3", "address": "10.0.0.2", "ports": [7001, 7002]}
        return subprocess.CompletedProcess(argv, 0, json.dumps(reply) + "\n", "")

    monkeypatch.setattr(subprocess, "run", port_step)
    ports = FreePortAllocator(cell_port=8000)
    placement = _placement({"n0": "127.0.0.1", "n1": "10.0.0.2"}, [Slot(0, "n1", "10.0.0.2", 0, 1)])
    placed = ports.reserve_on_nodes(placement, {"n1": 2}, python="PY", environ={})
    assert placed.bound["n1"].step == "7.3"
    assert [ports.on_node("P0_PORT", "n1"), ports.on_node("P0_BOOTSTRAP_PORT", "n1")] == [7001, 7002]


@pytest.mark.integration
def test_a_real_plan_gives_every_port_of_the_cell_once(tmp_path: Path):
    for cell in (ROUTED, DISAGGREGATED):
        plan = plan_cell(Cell.parse(cell), tmp_path, ports=FreePortAllocator(), environ={})
        assert plan.router is not None
        metrics_port = int(plan.router.metrics_url.rsplit(":", 1)[1].split("/")[0])
        given = [plan.port, metrics_port, *(i.port for i in plan.instances)]
        given += [i.bootstrap_port for i in plan.instances if i.bootstrap_port is not None]
        assert all(isinstance(p, int) for p in given) and len(set(given)) == len(given)


def test_the_dry_run_allocator_names_each_port_and_binds_nothing(tmp_path: Path, monkeypatch):
    ports = DryRunPortAllocator()
    assert (ports.cell_port, ports.dry_run) == ("$PORT", True)
    assert ports.on_host("ROUTER_METRICS_PORT", "127.0.0.1") == "$ROUTER_METRICS_PORT"
    placement = _placement({"n0": "127.0.0.1"}, [Slot(0, "n0", "127.0.0.1", 0, 1)])
    assert ports.reserve_on_nodes(placement, {"n0": 3}, python="PY", environ={}) is placement
    assert ports.on_node("DECODE0_NIXL_PORT", "n0") == "$DECODE0_NIXL_PORT"
    assert DryRunPortAllocator(cell_port=8000).cell_port == 8000

    def no_socket(*args: object) -> None:
        raise AssertionError("a dry run bound a port")

    monkeypatch.setattr(socket, "socket", no_socket)
    plan = plan_cell(Cell.parse(DISAGGREGATED), tmp_path, ports=DryRunPortAllocator(), environ={})
    assert plan.router is not None
    assert [(i.port, i.bootstrap_port) for i in plan.instances] == [
        ("$PREFILL0_PORT", "$PREFILL0_BOOTSTRAP_PORT"),
        ("$DECODE0_PORT", None),
    ]
    assert plan.router.metrics_url == "http://127.0.0.1:$ROUTER_METRICS_PORT/metrics"
    vllm = Cell.parse({**ONE_ENGINE, "engine": "vllm"})
    (engine,) = plan_cell(vllm, tmp_path, ports=DryRunPortAllocator(), environ={}).instances
    assert engine.port == "$PORT" and engine.kv_events_port == "$ENGINE0_KV_EVENTS_PORT"


def test_a_dry_run_given_a_port_shows_it_and_placeholders_for_the_rest(tmp_path, monkeypatch, capsys):
    for key in (CELL_ENV_VAR, "RESULT_DIR", "PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(CELL_ENV_VAR, json.dumps(ROUTED))
    monkeypatch.setenv("RESULT_DIR", str(tmp_path))
    monkeypatch.setenv("PORT", "8123")
    assert main(["cell", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--port 8123" in out and "$REPLICA0_PORT" in out and "$ROUTER_METRICS_PORT" in out


@pytest.mark.parametrize("shape", [ONE_ENGINE, ROUTED, DISAGGREGATED])
def test_a_step_renders_its_result_files_as_a_plan_of_its_own_would(tmp_path: Path, shape):
    """``for_step`` keeps the running instances and router and renders every command writing a result
    file (collectors, clients, power sampler) for the step's directory, as ``plan_cell`` does."""
    cell = Cell.parse(
        {**shape, "users": 4, "client_nodes": 2, "power_source": "dcgm", "power_endpoint": "engine"}
    )
    plan = plan_cell(cell, tmp_path / "cell", ports=DryRunPortAllocator(), environ={})
    step_cell = cell.replace(users=2, exp_name=f"{cell.exp_name}-step")
    step = plan.for_step(step_cell, tmp_path / "cell" / "steps" / "0")
    fresh = plan_cell(step_cell, tmp_path / "cell" / "steps" / "0", ports=DryRunPortAllocator(), environ={})
    assert (step.cell, step.result_dir, step.router) == (step_cell, fresh.result_dir, plan.router)
    assert [i.engine for i in step.instances] == [i.engine for i in plan.instances]
    assert [i.scraper_argv for i in step.instances] == [i.scraper_argv for i in fresh.instances]
    assert (step.replay_argv, step.client_argvs) == (fresh.replay_argv, fresh.client_argvs)
    assert len(step.client_argvs) == 2
    assert (step.router_scraper_argv, step.power_argv) == (fresh.router_scraper_argv, fresh.power_argv)
    assert bool(step.router_scraper_argv) == (shape is not ONE_ENGINE) and step.power_argv
