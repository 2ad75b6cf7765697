"""What a cell will run, resolved once: its engine instances, the router in front of them (if any), the
replayer, ports and files (``plan_cell`` builds it, the dry run prints it, the executor runs it), and
the options that bound its waits.

A cell is a list of engine instances. A cell without a router policy has one: the engine itself
(``engine``), which the client talks to directly, logging to ``server.log`` and scraped into
``server_metrics.csv``. A cell with a router policy has data-parallel replicas ``r<i>``, or prefill
instances ``p<i>`` and decode instances ``d<i>`` (disaggregated), behind the router the client talks
to. Each of those is the engine recipe's command for a one-instance copy of the cell (its role's
``tp`` GPUs, its share of the offload budget, its role flags), on a port of its own, scraped into
``server_metrics.<name>.csv``; the first instance answering the client logs to ``server.log``, the
others to ``server.<name>.log``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kv_cache_tester.replay.loop import SESSION_HEADERS

from agentsweep.cell import placement as placement_mod
from agentsweep.cell import record
from agentsweep.cell.accuracy_step import describe as describe_accuracy
from agentsweep.cell.clients import client
from agentsweep.cell.engines import EngineLaunch, EngineRecipe, PdRole, build_engine_launch, recipe
from agentsweep.cell.placement import Placement
from agentsweep.cell.port_allocation import Port, PortAllocator
from agentsweep.cell.power import sampler_spec
from agentsweep.cell.routers import PdWorkers, RouterLaunch, build_router_launch
from agentsweep.contract.cell import IN_PROCESS_ROUTER, Cell
from agentsweep.contract.hardware import is_amd
from agentsweep.contract.resultdir import (
    CLIENTS_DIR,
    POWER_CSV,
    ROUTER_METRICS_CSV,
    SERVER_LOG,
    SERVER_METRICS_CSV,
    instance_log,
    instance_metrics_csv,
)
from agentsweep.energy.spec import SamplerSpec
from agentsweep.errors import InputError

# engine: a cell's one engine, serving the client itself; the others stand behind a router.
Role = Literal["engine", "replica", "prefill", "decode"]
# Short names of the instances behind a router (r0, p0, d0...): their files and records use them.
NAME_PREFIX: dict[Role, str] = {"replica": "r", "prefill": "p", "decode": "d"}


@dataclass(frozen=True, kw_only=True)
class Instance:
    """One engine instance: the cell's engine, a replica (``r<i>``), or a prefill (``p<i>``) or decode
    (``d<i>``) instance."""

    role: Role
    index: int
    port: Port
    url: str
    engine: EngineLaunch
    log_name: str
    metrics_name: str
    # Its metrics collector, writing into the plan's result directory (``with_result_dir``).
    scraper_argv: list[str] = field(default_factory=list)
    name: str = ""  # "" for the cell's one engine
    bootstrap_port: Port | None = None  # a prefill instance's, where its engine serves one
    kv_events_port: Port | None = None  # where the engine publishes KV-cache events to its collector
    node: str = ""  # the node it runs on (multi-node cells: its own job step there)

    @property
    def label(self) -> str:
        return "engine" if self.role == "engine" else f"{self.role} {self.index}"

    @property
    def collector_log_name(self) -> str:
        """The log of its metrics collector."""
        return f"metrics-collector.{self.name}.log" if self.name else "metrics-collector.log"

    @property
    def collector_name(self) -> str:
        """Its metrics collector, as messages name it."""
        return "metrics collector" if self.role == "engine" else f"metrics collector of {self.label}"


@dataclass(frozen=True, kw_only=True)
class CellPlan:
    """Everything resolved for one cell: the exact commands and where results go.

    The commands that write into ``result_dir`` (the collectors, the replayer or client processes, the
    power sampler) are rendered for it by ``with_result_dir``.
    """

    cell: Cell
    result_dir: Path
    port: Port
    instances: list[Instance]  # in start order (prefill instances first)
    base_url: str  # where the client sends its requests: the router, else the one engine
    replay_argv: list[str] = field(default_factory=list)
    router: RouterLaunch | None = None
    router_scraper_argv: list[str] = field(default_factory=list)  # router_metrics.csv over the run
    placement: Placement | None = None
    power: SamplerSpec | None = None  # the power sampler's targets (None: the runner samples no power)
    power_argv: list[str] = field(default_factory=list)  # power.csv over the run
    # A cell with client_nodes > 1: every client process's command (client 0 here, on node 0; the
    # others as job steps on the next nodes), each writing clients/<k>/; empty for one client.
    client_argvs: list[list[str]] = field(default_factory=list)
    python: str = sys.executable  # the interpreter of the collectors and the replayer
    scrape_interval_s: float = 1.0

    def for_step(self, cell: Cell, result_dir: Path) -> CellPlan:
        """The plan of one replay of ``cell`` against this plan's running instances, its files in
        ``result_dir``: a capacity cell's step (same engines and router, its own collectors,
        replayer and result directory)."""
        return with_result_dir(self, cell, result_dir)

    @property
    def mode(self) -> Literal["dp", "pd"]:
        """``pd`` when prefill and decode run on separate instances, else ``dp`` (replicas, or one engine)."""
        return "pd" if self.prefill else "dp"

    @property
    def prefill(self) -> list[Instance]:
        return [r for r in self.instances if r.role == "prefill"]

    @property
    def decode(self) -> list[Instance]:
        return [r for r in self.instances if r.role == "decode"]

    @property
    def answering(self) -> list[Instance]:
        """The instances that answer the client (behind a router, their merged scrapes are
        server_metrics.csv)."""
        return self.decode if self.mode == "pd" else self.instances

    @property
    def client(self) -> Instance:
        """The first answering instance: its log is server.log, its version the engine's."""
        return self.answering[0]

    @property
    def engine(self) -> EngineLaunch:
        """The command of the client's instance (what cell.json records as the engine command)."""
        return self.client.engine

    def describe(self) -> list[str]:
        """Human lines: the exact commands (secrets masked, by name and by value)."""
        if self.router is None:
            lines = self._describe_engine()
            if self.cell.clock == "virtual":  # the same parts and flags, run in the cell's own process
                lines.insert(
                    0,
                    "clock:   virtual: engine, scraper, power and replay below run in one process, no socket",
                )
            return lines
        secrets = record.secret_values()
        tail = [
            *self._describe_power(),
            describe_accuracy(self.cell),
            *(
                [f"replay:  {shlex.join(self.replay_argv)}"]
                if not self.client_argvs
                else [f"client {k}: {shlex.join(argv)}" for k, argv in enumerate(self.client_argvs)]
            ),
            f"results: {self.result_dir}",
        ]
        head = (
            [f"clock:   virtual: every engine, scraper, power and the replay below run in one process, no "
             f"socket; the router is this process's, by policy {self.cell.router}"]
            if self.cell.clock == "virtual"
            else []
        )  # fmt: skip
        return [record.mask_text(line, secrets) for line in [*head, *self._describe_routed(), *tail]]

    def _describe_engine(self) -> list[str]:
        one = self.instances[0]
        secrets = record.secret_values() | record.secret_values(one.engine.env)
        return [
            f"engine:  {_command(one.engine, secrets)}",
            f"health:  {one.url}{one.engine.health_path}",
            f"scraper: {shlex.join(record.mask_argv(one.scraper_argv, secrets))}",
            *self._describe_power(),
            describe_accuracy(self.cell),
            f"replay:  {shlex.join(record.mask_argv(self.replay_argv, secrets))}",
            f"results: {record.mask_text(str(self.result_dir), secrets)}",
        ]

    def _describe_power(self) -> list[str]:
        if not self.power_argv:
            return [f"power:   none (runner {self.cell.runner} has power_source none)"]
        return [f"power:   {shlex.join(self.power_argv)}"]

    def _describe_routed(self) -> list[str]:
        assert self.router is not None
        lines = []
        if self.mode == "pd":
            lines.append(
                f"disaggregated: prefill {', '.join(r.name for r in self.prefill)}; "
                f"decode {', '.join(r.name for r in self.decode)}"
            )
        if self.placement is not None:
            lines += _describe_placement(self.placement)
        for inst in self.instances:
            secrets = record.secret_values() | record.secret_values(inst.engine.env)
            lines.append(f"{inst.label}: {_command(inst.engine, secrets)}")
            if self.placement is not None:
                lines.append(f"  node:    {inst.node}")
            lines.append(f"  health:  {inst.url}{inst.engine.health_path}")
            if inst.bootstrap_port is not None:
                lines.append(f"  bootstrap port: {inst.bootstrap_port}")
            lines += [f"  note:    {note}" for note in inst.engine.notes]
            lines.append(f"  scraper: {shlex.join(inst.scraper_argv)}")
            lines.append(f"  log:     {inst.log_name}")
        lines.append(f"router:  {shlex.join(self.router.argv)}")
        lines.append(f"  ready:   {self.base_url}{self.router.ready_path}")
        lines.append(f"  metrics: {self.router.metrics_url}")
        if self.router_scraper_argv:
            lines.append(f"  scraper: {shlex.join(self.router_scraper_argv)}")
        lines.append(f"  session headers: {', '.join(SESSION_HEADERS)}")
        return lines

    def scaleout_record(self) -> dict[str, Any]:
        """What cell.json keeps of a routed plan under ``scaleout`` (commands with secrets masked)."""
        assert self.router is not None
        out: dict[str, Any] = {"mode": self.mode}
        out["replicas"] = []
        for r in self.instances:
            item: dict[str, Any] = {
                "name": r.name,
                "role": r.role,
                "url": r.url,
                "node": r.node,
                "command": record.mask_argv(r.engine.argv),
                "env": record.mask_env(r.engine.env),
            }
            if r.bootstrap_port is not None:
                item["bootstrap_port"] = r.bootstrap_port
            out["replicas"].append(item)
        if self.mode == "pd":
            out["prefill"] = [r.url for r in self.prefill]
            out["decode"] = [r.url for r in self.decode]
        if self.cell.clock == "virtual":  # routed in the cell's own process, by its policy
            out["router"] = {"program": IN_PROCESS_ROUTER, "policy": self.cell.router, "url": self.base_url}
        else:
            out["router"] = {
                "program": self.router.program,
                "command": self.router.argv,
                "url": self.base_url,
            }
        if self.placement is not None:
            out["placement"] = self.placement.to_record()
        return out


def _describe_placement(placement: Placement) -> list[str]:
    """Where the instances run: the job's nodes and addresses, the container, each node's ports."""
    where = "in the host's environment" if placement.runtime == "none" else f"in {placement.runtime}"
    nodes = ", ".join(f"{n} ({placement.addresses[n]})" for n in placement.nodes)
    lines = [f"placement: job {placement.job_id}, nodes {nodes}; each engine a step on its node, {where}"]
    if not placement.bound:
        lines.append("  ports:   each node's bound on that node when the cell starts")
    for node, bound in placement.bound.items():
        step = f" (step {bound.step})" if bound.step else ""
        ports = ", ".join(map(str, bound.ports))
        lines.append(f"  ports on {node}: {ports}, bound on {bound.address} by {bound.bound_on}{step}")
    return lines


def _command(launch: EngineLaunch, secrets: set[str]) -> str:
    """``NAME=value ... argv`` of an engine launch, secrets masked (by name and by value)."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(record.mask_env(launch.env).items()))
    argv = shlex.join(record.mask_argv(launch.argv, secrets))
    return f"{env} {argv}" if env else argv


@dataclass(frozen=True)
class CellOptions:
    """Timeouts; None = the engine's default (short for sim, long for real engines loading weights)."""

    health_timeout_s: float | None = None
    engine_stop_grace_s: float | None = None
    replay_timeout_s: float | None = None
    replay_stop_grace_s: float = 30.0
    # After the engine dies, time left to the replayer's circuit breaker before the cell SIGTERMs it.
    engine_death_wait_s: float = 30.0
    scrape_interval_s: float = 1.0

    def health_timeout(self, engine: str) -> float:
        if self.health_timeout_s is not None:
            return self.health_timeout_s
        return recipe(engine).health_timeout_s

    def engine_grace(self, engine: str) -> float:
        if self.engine_stop_grace_s is not None:
            return self.engine_stop_grace_s
        return recipe(engine).stop_grace_s

    def replay_timeout(self, duration: int) -> float:
        if self.replay_timeout_s is not None:
            return self.replay_timeout_s
        return 2.0 * duration + 600.0


def plan_cell(
    cell: Cell,
    result_dir: Path,
    *,
    ports: PortAllocator,
    host: str = "127.0.0.1",
    python: str = sys.executable,
    environ: Mapping[str, str] = os.environ,
    scrape_interval_s: float = 1.0,
    placement: Placement | None = None,
) -> CellPlan:
    """Resolve every command of ``cell``; the client's endpoint is ``host`` and ``ports.cell_port``.

    Everything the plan needs of the cell's runner (hardware, node size, KV links) is in the cell.
    Every other port (the instances behind a router, prefill bootstrap ports, KV handshake ports, the
    router's metrics) comes from ``ports``: real ones of this host, or a dry run's placeholders. A
    cell spanning several nodes of its Slurm job (``placement``) starts each instance as a job step on
    its node, bound to the node's address, on ports reserved on that node before anything starts; the
    router stays here, on node 0. The caller finds the placement (``placement.from_environ``, which
    asks Slurm): planning asks nothing of the system but the ports ``ports`` gives.
    """
    engine_recipe = recipe(cell.engine)
    shapes = instance_shapes(cell)
    slices = device_slices(cell, environ) if placement is None else [{} for _ in shapes]
    if placement is not None:  # each node's ports reserved there, before anything starts
        counts: dict[str, int] = {}
        for slot, (role, _i, _tp) in zip(placement.slots, shapes, strict=True):
            counts[slot.node] = counts.get(slot.node, 0) + ports_needed(role, engine_recipe)
        placement = ports.reserve_on_nodes(placement, counts, python=python, environ=environ)
    instances = [
        _plan_instance(
            cell, k, shape, devices, ports, host=host, python=python, environ=environ, placement=placement
        )
        for k, (shape, devices) in enumerate(zip(shapes, slices, strict=True))
    ]
    if cell.client_nodes > 1:
        have = len(placement.nodes) if placement is not None else 1
        if cell.client != "replay" or (cell.client_nodes > min(have, cell.users) and not ports.dry_run):
            raise InputError(
                f"cell {cell.exp_name}: client_nodes {cell.client_nodes} needs the replay client, at least "
                f"as many users ({cell.users}) and a Slurm allocation of as many nodes (it has {have})"
            )
        if placement is not None:  # the router: reached from every client node
            host = placement.addresses[placement.nodes[0]]
    base_url = f"http://{host}:{ports.cell_port}"
    router = None
    if cell.routed:
        workers: list[str] | PdWorkers = [r.url for r in instances]
        if cell.disaggregated:
            workers = PdWorkers(
                prefill=[(r.url, r.bootstrap_port) for r in instances if r.role == "prefill"],
                decode=[r.url for r in instances if r.role == "decode"],
            )
        router = build_router_launch(
            cell,
            workers,
            host=host,
            port=ports.cell_port,
            metrics_port=ports.on_host("ROUTER_METRICS_PORT", host),
            python=python,
        )
    power = sampler_spec(
        cell,
        [
            (inst.name, inst.node, tp, inst.url + inst.engine.metrics_path)
            for inst, (_r, _i, tp) in zip(instances, shapes, strict=True)
        ],
        slices,
        placement,
        environ,
        simulated=engine_recipe.simulated,
        local_node=placement_mod.local_node(environ),
    )
    plan = CellPlan(
        cell=cell,
        result_dir=result_dir,
        port=ports.cell_port,
        instances=instances,
        base_url=base_url,
        router=router,
        placement=placement,
        power=power,
        python=python,
        scrape_interval_s=scrape_interval_s,
    )
    return with_result_dir(plan, cell, result_dir)


def _plan_instance(
    cell: Cell,
    index: int,
    shape: tuple[Role, int, int],
    devices: Mapping[str, str],
    ports: PortAllocator,
    *,
    host: str,
    python: str,
    environ: Mapping[str, str],
    placement: Placement | None,
) -> Instance:
    """Engine instance ``index`` of the cell (``shape``: its role, index in that role and tp), its
    commands but those writing into the result directory (``with_result_dir`` renders them)."""
    role, i, tp = shape
    engine_recipe = recipe(cell.engine)
    slot = placement.slots[index] if placement is not None else None
    address = slot.address if slot is not None else host
    tag = f"{role.upper()}{i}"
    name = f"{NAME_PREFIX[role]}{i}" if role != "engine" else ""
    port = ports.cell_port if role == "engine" else _instance_port(ports, f"{tag}_PORT", slot, host)
    pd = None
    bootstrap_port: Port | None = None
    if role in ("prefill", "decode"):
        if role == "prefill" and engine_recipe.pd_bootstrap:
            bootstrap_port = _instance_port(ports, f"{tag}_BOOTSTRAP_PORT", slot, host)
        side = (
            _instance_port(ports, f"{tag}_NIXL_PORT", slot, host) if engine_recipe.pd_side_channel else None
        )
        pd = PdRole(
            "prefill" if role == "prefill" else "decode",
            bootstrap_port=bootstrap_port,
            side_channel_port=side,
            kv_transfer_gbs=cell.kv_transfer_gbs,
        )
    launch = build_engine_launch(
        cell if role == "engine" else instance_cell(cell, tp), hardware=cell.node.hardware or None, port=port,
        host=address, python=python, environ=environ, pd=pd,
    )  # fmt: skip
    if devices:
        launch = dataclasses.replace(launch, env={**launch.env, **devices})
    if placement is not None:  # its own step on its node; the step selects its GPUs there
        launch = dataclasses.replace(launch, argv=placement.wrap(index, launch.argv, launch.env))
    # An engine that counts evictions only as KV-cache events publishes them to its scraper (on this
    # host: an instance on another node, or a capacity search whose steps each have a scraper of their
    # own, keeps its evictions uncounted).
    events_port: Port | None = None
    if (
        slot is None
        and cell.capacity is None
        and engine_recipe.kv_events_args("")
        and not _gives_kv_events(cell)
    ):
        events_port = ports.on_host(f"{tag}_KV_EVENTS_PORT", host)
        launch = dataclasses.replace(
            launch, argv=launch.argv + engine_recipe.kv_events_args(f"tcp://{host}:{events_port}")
        )
    client_name = "d0" if cell.disaggregated else "r0"
    return Instance(
        role=role,
        index=i,
        port=port,
        url=f"http://{address}:{port}",
        engine=launch,
        log_name=instance_log(name) if name and name != client_name else SERVER_LOG,
        metrics_name=instance_metrics_csv(name) if name else SERVER_METRICS_CSV,
        name=name,
        bootstrap_port=bootstrap_port,
        kv_events_port=events_port,
        node=slot.node if slot is not None else placement_mod.local_node(environ),
    )


def _instance_port(ports: PortAllocator, name: str, slot: placement_mod.Slot | None, host: str) -> Port:
    """A port an instance serves: reserved on its own node when it is placed on one, else this host's."""
    return ports.on_node(name, slot.node) if slot is not None else ports.on_host(name, host)


def with_result_dir(plan: CellPlan, cell: Cell, result_dir: Path) -> CellPlan:
    """``plan`` for ``cell`` writing into ``result_dir``: every command that writes a result file (each
    instance's metrics collector, the router's, the replayer or the client processes, the power
    sampler) rendered for it."""
    instances = [
        dataclasses.replace(
            inst,
            scraper_argv=scraper_argv(
                plan.python,
                inst.url + inst.engine.metrics_path,
                result_dir / inst.metrics_name,
                plan.scrape_interval_s,
                inst.kv_events_port,
            ),
        )
        for inst in plan.instances
    ]
    replay, clients = client_commands(
        cell, recipe(cell.engine), plan.base_url, result_dir, plan.python, plan.placement
    )
    return dataclasses.replace(
        plan,
        cell=cell,
        result_dir=result_dir,
        instances=instances,
        replay_argv=replay,
        client_argvs=clients,
        router_scraper_argv=(
            router_scraper_argv(plan.python, plan.router, instances, result_dir, plan.scrape_interval_s)
            if plan.router is not None
            else []
        ),
        power_argv=(
            power_sampler_argv(plan.python, plan.power, result_dir / POWER_CSV)
            if plan.power is not None
            else []
        ),
    )


def router_scraper_argv(
    python: str, router: RouterLaunch, instances: list[Instance], result_dir: Path, interval_s: float
) -> list[str]:
    """The router's metrics collector: its /metrics into ``result_dir``'s router_metrics.csv."""
    return [
        python, "-m", "agentsweep.cli", "router-metrics-collector",
        "--endpoint", router.metrics_url, "--program", router.program,
        *(arg for r in instances for arg in ("--instance", f"{r.name}={r.url}")),
        "--output", str(result_dir / ROUTER_METRICS_CSV),
        "--interval", f"{interval_s:g}",
    ]  # fmt: skip


def client_commands(
    cell: Cell,
    engine_recipe: EngineRecipe,
    base_url: str,
    result_dir: Path,
    python: str,
    placement: Placement | None,
) -> tuple[list[str], list[list[str]]]:
    """The replay command, and with client_nodes > 1 every client process's (client 0 is the replay
    command, on node 0; the others job steps on the next nodes), each writing clients/<k>/."""
    replay = client(cell.client).command(
        cell, engine=engine_recipe, endpoint=base_url, output_dir=result_dir, python=python
    )
    client_argvs: list[list[str]] = []
    if cell.client_nodes > 1:
        count = cell.client_nodes
        for k in range(count):
            argv = client(cell.client).command(
                cell,
                engine=engine_recipe,
                endpoint=base_url,
                output_dir=client_dir(result_dir, k),
                python=python,
            )
            argv += ["--client-count", str(count), "--client-index", str(k)]
            if k and placement is not None:
                argv = [*placement.client_step_prefix(placement.nodes[k % len(placement.nodes)]), *argv]
            client_argvs.append(argv)  # a dry run without an allocation shows the clients unplaced
        replay = client_argvs[0]
    return replay, client_argvs


def client_dir(result_dir: Path, index: int) -> Path:
    """Where client process ``index`` of a cell with several writes its own records and summary."""
    return result_dir / CLIENTS_DIR / str(index)


def power_sampler_argv(python: str, spec: SamplerSpec, output: Path) -> list[str]:
    """The power sampler of a cell: ``spec`` (one JSON value) into ``output`` (power.csv)."""
    return [
        python,
        "-m",
        "agentsweep.cli",
        "power-sampler",
        "--spec",
        spec.to_json(),
        "--output",
        str(output),
    ]


def scraper_argv(
    python: str, endpoint: str, output: Path, interval_s: float, events_port: Port | None = None
) -> list[str]:
    """The metrics collector of one engine instance: ``endpoint`` (its /metrics) into ``output``; with
    ``events_port`` it also counts the engine's KV-cache events published to that port."""
    events = ["--kv-events-port", str(events_port)] if events_port is not None else []
    return [
        python, "-m", "agentsweep.cli", "metrics-collector",
        "--endpoint", endpoint,
        "--output", str(output),
        "--interval", f"{interval_s:g}",
        *events,
    ]  # fmt: skip


def _gives_kv_events(cell: Cell) -> bool:
    """The cell's own engine_args already configure the engine's KV-cache events."""
    return any(word.split("=", 1)[0] == "--kv-events-config" for word in shlex.split(cell.engine_args))


def ports_needed(role: Role, engine_recipe: EngineRecipe) -> int:
    """Ports an instance behind a router takes: its own, a prefill's bootstrap port where the engine
    serves one, a disaggregated instance's KV handshake port where the engine needs one."""
    if role == "engine":
        return 0  # the cell's port
    extra = int(role == "prefill" and engine_recipe.pd_bootstrap)
    extra += int(role in ("prefill", "decode") and engine_recipe.pd_side_channel)
    return 1 + extra


def instance_shapes(cell: Cell) -> list[tuple[Role, int, int]]:
    """(role, index, tp) of every engine instance, in start order."""
    if cell.prefill is not None and cell.decode is not None:
        return [("prefill", i, cell.prefill.tp) for i in range(cell.prefill.replicas)] + [
            ("decode", i, cell.decode.tp) for i in range(cell.decode.replicas)
        ]
    if cell.routed:
        return [("replica", i, cell.tp) for i in range(cell.replicas)]
    return [("engine", 0, cell.tp)]


def instance_cell(cell: Cell, tp: int) -> Cell:
    """The one-instance cell an instance behind a router is started for: ``tp`` GPUs, its share of the
    DRAM budget.

    A replica's share is ``cpu_dram_gb / replicas``; a prefill or decode instance's is
    ``cpu_dram_gb x tp / gpus`` (its GPUs' part of the cell's), both floored to 0.1 GiB.
    """
    if cell.disaggregated:
        share = math.floor(round(cell.cpu_dram_gb * tp / cell.gpus * 10, 6)) / 10
    else:
        share = math.floor(round(cell.cpu_dram_gb / cell.replicas * 10, 6)) / 10
    return cell.replace(
        replicas=1, router="", gpus=tp, tp=tp, cpu_dram_gb=share, prefill=None, decode=None, nodes=1
    )


def _shape(cell: Cell) -> str:
    if cell.prefill is not None and cell.decode is not None:
        return f"prefill {cell.prefill.label} + decode {cell.decode.label}"
    return f"{cell.replicas} replicas x tp {cell.tp}"


def device_slices(cell: Cell, environ: Mapping[str, str]) -> list[dict[str, str]]:
    """Each instance's own GPUs, in start order, as the environment its engine starts with ({} for the
    simulated engine, and for a cell's one engine, which takes every GPU it is given).

    NVIDIA: instance k gets the next ``tp`` IDs of CUDA_VISIBLE_DEVICES (what the allocation gave the
    cell), or of 0..gpus-1 when it is unset. MI355X: HIP_VISIBLE_DEVICES indexes inside what
    ROCR_VISIBLE_DEVICES (set by the allocation) shows, so the indices run from 0 the same way.
    """
    tps = [tp for _role, _i, tp in instance_shapes(cell)]
    if recipe(cell.engine).simulated or not cell.routed:
        return [{} for _ in tps]
    need = sum(tps)
    if is_amd(cell.node.hardware):
        var, ids = "HIP_VISIBLE_DEVICES", [str(i) for i in range(max(need, cell.gpus))]
    else:
        var = "CUDA_VISIBLE_DEVICES"
        given = environ.get(var, "").strip()
        ids = (
            [d.strip() for d in given.split(",") if d.strip()]
            if given
            else [str(i) for i in range(max(need, cell.gpus))]
        )
        if len(ids) < need:
            raise InputError(
                f"cell {cell.exp_name}: {_shape(cell)} need {need} GPUs but {var}={given} shows {len(ids)}"
            )
    starts = list(itertools.accumulate(tps, initial=0))
    return [{var: ",".join(ids[a : a + tp])} for a, tp in zip(starts, tps, strict=False)]
