"""What a cell will run, resolved once: the commands, ports and files (``plan_cell`` builds it, the dry
run prints it, ``run_cell`` executes it), and the options that bound its waits."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentsweep.cell import record
from agentsweep.cell.engines import EngineLaunch, recipe
from agentsweep.cell.placement import Placement
from agentsweep.cell.routers import SESSION_HEADERS, RouterLaunch
from agentsweep.contract.cell import Cell

Role = Literal["replica", "prefill", "decode"]


@dataclass(frozen=True)
class Replica:
    """One engine instance: a replica (``r<i>``), or a prefill (``p<i>``) or decode (``d<i>``) instance."""

    index: int
    port: int | str
    url: str
    engine: EngineLaunch
    log_name: str
    metrics_name: str
    scraper_argv: list[str]
    name: str = ""
    role: Role = "replica"
    bootstrap_port: int | str | None = None  # a prefill instance's, where its engine serves one
    node: str = ""  # the node it runs on (multi-node cells: its own job step there)

    @property
    def label(self) -> str:
        return f"{self.role} {self.index}"


@dataclass(frozen=True)
class ScaleoutPlan:
    """The engine instances and the router of one cell (the replayer and results are the CellPlan's).

    ``mode`` is ``dp`` (replicas, each serving whole requests) or ``pd`` (prefill instances, then
    decode instances; the router sends each request through one of each).
    """

    replicas: list[Replica]  # every instance, in start order (prefill instances first)
    router: RouterLaunch
    router_url: str
    mode: Literal["dp", "pd"] = "dp"
    placement: Placement | None = None
    router_scraper_argv: list[str] = field(default_factory=list)  # router_metrics.csv over the run

    @property
    def prefill(self) -> list[Replica]:
        return [r for r in self.replicas if r.role == "prefill"]

    @property
    def decode(self) -> list[Replica]:
        return [r for r in self.replicas if r.role == "decode"]

    @property
    def answering(self) -> list[Replica]:
        """The instances that answer the client (their merged scrapes are server_metrics.csv)."""
        return self.decode if self.mode == "pd" else self.replicas

    @property
    def client(self) -> Replica:
        """The first answering instance: its log is server.log, its version the engine's."""
        return self.answering[0]

    def describe(self) -> list[str]:
        lines = []
        if self.mode == "pd":
            lines.append(
                f"disaggregated: prefill {', '.join(r.name for r in self.prefill)}; "
                f"decode {', '.join(r.name for r in self.decode)}"
            )
        for rep in self.replicas:
            env = " ".join(
                f"{k}={shlex.quote(v)}" for k, v in sorted(record.mask_env(rep.engine.env).items())
            )
            argv = shlex.join(record.mask_argv(rep.engine.argv))
            lines.append(f"{rep.label}: {env + ' ' if env else ''}{argv}")
            if self.placement is not None:
                lines.append(f"  node:    {rep.node}")
            lines.append(f"  health:  {rep.url}{rep.engine.health_path}")
            if rep.bootstrap_port is not None:
                lines.append(f"  bootstrap port: {rep.bootstrap_port}")
            lines.append(f"  scraper: {shlex.join(rep.scraper_argv)}")
            lines.append(f"  log:     {rep.log_name}")
        lines.append(f"router:  {shlex.join(self.router.argv)}")
        lines.append(f"  ready:   {self.router_url}{self.router.ready_path}")
        lines.append(f"  metrics: {self.router.metrics_url}")
        if self.router_scraper_argv:
            lines.append(f"  scraper: {shlex.join(self.router_scraper_argv)}")
        lines.append(f"  session headers: {', '.join(SESSION_HEADERS)}")
        return lines

    def to_record(self) -> dict[str, Any]:
        """What cell.json keeps of the plan (commands with secrets masked)."""
        out: dict[str, Any] = {"mode": self.mode}
        out["replicas"] = []
        for r in self.replicas:
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
        out["router"] = {"program": self.router.program, "command": self.router.argv, "url": self.router_url}
        if self.placement is not None:
            out["placement"] = self.placement.to_record()
        return out


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


@dataclass(frozen=True)
class CellPlan:
    """Everything resolved for one cell: the exact commands and where results go."""

    cell: Cell
    result_dir: Path
    port: int | str
    hardware: str | None
    engine: EngineLaunch
    replay_argv: list[str]
    scraper_argv: list[str]
    base_url: str
    env_overrides: dict[str, str] = field(default_factory=dict)
    # Instances behind a router (a cell with a router policy); engine is then the command of the first
    # instance answering the client (replica 0, or decode instance 0).
    scaleout: ScaleoutPlan | None = None

    def describe(self) -> list[str]:
        """Human lines: the exact commands (secrets masked, by name and by value)."""
        if self.scaleout is not None:
            secrets = record.secret_values()
            tail = [f"replay:  {shlex.join(self.replay_argv)}", f"results: {self.result_dir}"]
            return [record.mask_text(line, secrets) for line in [*self.scaleout.describe(), *tail]]
        env = record.mask_env(self.engine.env)
        secrets = record.secret_values() | record.secret_values(self.engine.env)
        env_text = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        engine = shlex.join(record.mask_argv(self.engine.argv, secrets))
        return [
            f"engine:  {env_text + ' ' if env_text else ''}{engine}",
            f"health:  {self.base_url}{self.engine.health_path}",
            f"scraper: {shlex.join(record.mask_argv(self.scraper_argv, secrets))}",
            f"replay:  {shlex.join(record.mask_argv(self.replay_argv, secrets))}",
            f"results: {record.mask_text(str(self.result_dir), secrets)}",
        ]
