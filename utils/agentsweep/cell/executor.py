"""Run a cell's plan: its engine instances, the router in front of them (if any), a metrics collector
per instance (and the router's), the power sampler, then the replayer; stop everything, whatever
happens.

One path for every cell: a cell without a router is a plan of one instance. Instances start in plan
order (prefill first) and must all be healthy within the engine's health timeout; then the router
starts and must say it is ready. After the replay, once the engines' and the router's counts stand
still (``agentsweep.cell.settle``), the collectors take their last scrape together, the router's
figures go to router.json while it still runs, and the scrapes of the instances behind
a router are merged into server_metrics.csv (and server_metrics.prefill.csv). The power sampler starts
and stops with the collectors; unlike theirs, its failure never fails the cell (its faults are in
power.csv, and the power summary withholds the cell's power figures).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kv_cache_tester.replay import RUN_META_FILE, ResultError, merge_clients

from agentsweep.cell import record
from agentsweep.cell.accuracy_step import run_accuracy_step
from agentsweep.cell.effective import Stated, stated_settings
from agentsweep.cell.engine_process import EngineFailed, EngineProcess, ManagedProcess, tail_lines, trim_log
from agentsweep.cell.engines import recipe
from agentsweep.cell.plan import CellOptions, CellPlan, client_dir
from agentsweep.cell.replicas import RouterRead, settled_router_metrics, write_router_figures
from agentsweep.cell.routers import missing_router, router_recipe, router_version
from agentsweep.cell.settle import SETTLE_TIMEOUT_S, settle_instance_counts
from agentsweep.cell.stop import raise_if_stopped
from agentsweep.contract.resultdir import (
    PREFILL_METRICS_CSV,
    ROUTER_METRICS_CSV,
    SERVER_LOG,
    SERVER_METRICS_CSV,
)
from agentsweep.metrics.scrapes import merge_metrics
from agentsweep.watchdog import Watchdog

POWER_SAMPLER_LOG = "power-sampler.log"
# How long the replay waits for every collector's first row (each takes it as it starts).
FIRST_SCRAPE_TIMEOUT_S = 15.0


class InstanceProcess(EngineProcess):
    """An engine instance or the router: its messages name it and its own log."""

    def __init__(self, label: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.label = label

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.2) -> float:
        try:
            return super().wait_healthy(timeout_s, poll_s)
        except EngineFailed as err:
            raise EngineFailed(self._rename(str(err))) from None

    def died_reason(self) -> str | None:
        reason = super().died_reason()
        return self._rename(reason) if reason else None

    def _rename(self, text: str) -> str:
        text = text.replace(SERVER_LOG, self.log_path.name)
        return self.label + text.removeprefix("engine") if text.startswith("engine") else text


class _Group:
    """The instances and the router seen as one engine by the replay watcher."""

    def __init__(self, members: Sequence[InstanceProcess]) -> None:
        self.members = list(members)

    def died_reason(self) -> str | None:
        for member in self.members:
            if member.proc is not None:
                reason = member.died_reason()
                if reason:
                    return reason
        return None


def execute(
    plan: CellPlan,
    options: CellOptions,
    versions: dict[str, str | None],
    say: Callable[[str], None],
    watchdog: Watchdog | None = None,
    stated: dict[str, Stated | None] | None = None,
) -> str | None:
    """Run ``plan`` and stop everything it started; returns why the run failed, or None.

    ``versions`` gets the engine's (and the router's) version, ``stated`` what each instance's
    start-up log says it runs with (by instance name, "engine" for a cell's one engine). Raises
    ``EngineFailed`` when an instance or the router never becomes healthy.
    """
    group = EngineGroup(plan, options, versions, say, watchdog)
    missing = group.missing_router()
    if missing:  # before any engine loads its weights
        return missing
    with group:
        if stated is not None:
            stated.update(group.stated)
        run_accuracy_step(plan.cell, plan.base_url, plan.result_dir, say)
        reason = replay(plan, group, options, say, watchdog)
    return reason


class EngineGroup:
    """A plan's engine instances and its router, started healthy on entry and stopped on exit.

    A cell runs one replay against it (``execute``); a capacity cell runs one per search step, each
    with a plan of its own result directory (``CellPlan.for_step``) against the same instances.
    """

    def __init__(
        self,
        plan: CellPlan,
        options: CellOptions,
        versions: dict[str, str | None],
        say: Callable[[str], None],
        watchdog: Watchdog | None = None,
    ) -> None:
        self.plan = plan
        self.options = options
        self.versions = versions
        self.say = say
        self.watchdog = watchdog
        rd = plan.result_dir
        grace = options.engine_grace(plan.cell.engine)
        self.engines = [
            InstanceProcess(
                inst.label,
                inst.engine.argv,
                log_path=rd / inst.log_name,
                base_url=inst.url,
                health_path=inst.engine.health_path,
                env={**os.environ, **inst.engine.env},
                stop_grace_s=grace,
                watchdog=watchdog,
            )
            for inst in plan.instances
        ]
        self.program = plan.router.program if plan.router is not None else ""
        self.router: InstanceProcess | None = None
        if plan.router is not None:
            self.router = InstanceProcess(
                f"router ({self.program})",
                plan.router.argv,
                log_path=rd / "router.log",
                base_url=plan.base_url,
                health_path=plan.router.ready_path,
                env=dict(os.environ),
                stop_grace_s=10.0,
                watchdog=watchdog,
            )
        # What each instance's start-up log says it runs with (by instance name, "engine" for a cell's
        # one engine), read once every instance is healthy.
        self.stated: dict[str, Stated | None] = {}
        self._stack = contextlib.ExitStack()

    def missing_router(self) -> str | None:
        """Why the router program cannot start here (not installed), or None."""
        if self.plan.router is None:
            return None
        return missing_router(router_recipe(self.program), self.plan.router.argv[0])

    @property
    def members(self) -> list[InstanceProcess]:
        return [*self.engines, *([self.router] if self.router is not None else [])]

    @property
    def log_names(self) -> list[str]:
        """The logs of the instances (and the router), in the cell's result directory."""
        return [inst.log_name for inst in self.plan.instances] + (["router.log"] if self.router else [])

    def died_reason(self) -> str | None:
        return _Group(self.members).died_reason()

    def __enter__(self) -> EngineGroup:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        plan, say, stack = self.plan, self.say, self._stack
        for eng in self.engines:
            say(f"starting {eng.label}: {shlex.join(record.mask_argv(eng.argv))}")
            stack.enter_context(eng)
        timeout = self.options.health_timeout(plan.cell.engine)
        start = time.monotonic()
        for eng in self.engines:  # one timeout for them all
            eng.wait_healthy(max(0.1, round(timeout - (time.monotonic() - start), 1)))
        waited = time.monotonic() - start
        if self.router is None:
            say(f"engine healthy after {waited:.1f} s")
        else:
            what = "instances" if plan.mode == "pd" else "replicas"
            say(f"{len(self.engines)} {what} healthy after {waited:.1f} s")
        self.versions["engine"] = recipe(plan.cell.engine).version(plan.client.url)
        for inst in plan.instances:
            self.stated[inst.name or "engine"] = stated_settings(
                plan.cell.engine, plan.result_dir / inst.log_name
            )
        if self.router is not None:
            self.versions["router"] = f"{self.program} {router_version(self.program) or 'unknown'}"
            say(f"starting router: {shlex.join(self.router.argv)}")
            stack.enter_context(self.router)
            say(f"router ready after {self.router.wait_healthy(timeout):.1f} s")

    def __exit__(self, *exc: object) -> None:
        try:
            self._stack.close()
        finally:
            for name in self.log_names:
                trim_log(self.plan.result_dir / name)


def replay(
    plan: CellPlan,
    group: EngineGroup,
    options: CellOptions,
    say: Callable[[str], None],
    watchdog: Watchdog | None = None,
) -> str | None:
    """One replay of ``plan`` against the running ``group``: metrics collectors around the replayer,
    the router's figures, the instances' scrapes merged; returns why it failed, or None.

    ``plan`` may be a step's plan (its files in the step's result directory).
    """
    cell, rd = plan.cell, plan.result_dir
    rd.mkdir(parents=True, exist_ok=True)
    reason: str | None = None
    with contextlib.ExitStack() as stack:
        # Each collector with the CSV it writes.
        collectors = [
            (
                ManagedProcess(
                    inst.scraper_argv,
                    log_path=rd / inst.collector_log_name,
                    name=inst.collector_name,
                    stop_grace_s=10.0,
                    watchdog=watchdog,
                ),
                rd / inst.metrics_name,
            )
            for inst in plan.instances
        ]
        if group.router is not None and plan.router_scraper_argv:
            router_collector = ManagedProcess(
                plan.router_scraper_argv,
                log_path=rd / "router-metrics-collector.log",
                name="metrics collector of the router",
                stop_grace_s=10.0,
                watchdog=watchdog,
            )
            collectors.append((router_collector, rd / ROUTER_METRICS_CSV))
        scrapers = [scraper for scraper, _csv in collectors]
        for scraper in scrapers:
            stack.enter_context(scraper)
        late = _first_rows(collectors, FIRST_SCRAPE_TIMEOUT_S)
        if late:
            say(
                f"no first scrape from {', '.join(late)} within {FIRST_SCRAPE_TIMEOUT_S:g} s: replaying anyway"
            )
        sampler = None
        if plan.power_argv:
            sampler = ManagedProcess(
                plan.power_argv,
                log_path=rd / POWER_SAMPLER_LOG,
                name="power sampler",
                stop_grace_s=15.0,
                watchdog=watchdog,
            )
            stack.enter_context(sampler)
        replayer: ManagedProcess | ClientGroup
        if plan.client_argvs:
            replayer = ClientGroup(plan, options, watchdog)
        else:
            replayer = ManagedProcess(
                plan.replay_argv,
                log_path=rd / "replay.log",
                name="replayer",
                stop_grace_s=options.replay_stop_grace_s,
                watchdog=watchdog,
            )
        through = f" through {plan.base_url}" if group.router is not None else ""
        on = f" on {len(plan.client_argvs)} client nodes" if plan.client_argvs else ""
        say(f"replaying {cell.users} users for {cell.duration} s{through}{on}")
        try:
            reason = _watch_replay(_Group(group.members), replayer, options, cell.duration)
        finally:
            replayer.stop()  # no-op when it already exited; on an interrupt it flushes its files
        if isinstance(replayer, ClientGroup):
            problem = replayer.merge()
            reason = reason or problem
        for scraper in scrapers:
            code = scraper.poll()
            if reason is None and code is not None:
                reason = f"{scraper.name} exited early with status {code}{_hint(scraper)}"
        samplers = [sampler] if sampler is not None else []
        if sampler is not None and sampler.poll() is not None:
            say(f"power sampler exited early with status {sampler.poll()}{_hint(sampler)}")
        # Before the collectors' last scrape: every engine, then the router, has finished counting
        # the last requests, so the last rows agree with what the client saw (and router.json with
        # the last row of router_metrics.csv).
        if not settle_instance_counts(plan):
            say(f"the engines' counts still moved {SETTLE_TIMEOUT_S:g} s after the replay ended")
        router_read: RouterRead | None = None
        if group.router is not None and group.router.poll() is None:
            router_read = settled_router_metrics(plan)
            if not router_read.settled:
                say(f"the router's counts still moved {SETTLE_TIMEOUT_S:g} s after the replay ended")
        for scraper in [*scrapers, *samplers]:  # all take their last scrape at about the same moment
            scraper.signal_group(signal.SIGTERM)
        for scraper in [*scrapers, *samplers]:
            scraper.stop()
        if router_read is not None:
            write_router_figures(plan, rd, router_read)
        for eng in group.engines:
            if eng.poll() is not None:  # died on its own during the replay
                show_tail(eng.log_path, say)
    if group.router is not None:
        merge_metrics([rd / r.metrics_name for r in plan.answering], rd / SERVER_METRICS_CSV)
        if plan.mode == "pd":
            merge_metrics([rd / r.metrics_name for r in plan.prefill], rd / PREFILL_METRICS_CSV)
    return reason


# Between starting the client processes and their common start instant (--start-at): time for a job
# step to start on every node and for each replayer to load its traces.
CLIENT_START_SLACK_S = 20.0


class ClientGroup:
    """The client processes of a cell whose lanes run on several nodes (``CellPlan.client_argvs``),
    seen as one replayer by the watcher: started together with one common start instant, waited for
    together, and merged into the cell's requests.jsonl and summary.json afterwards."""

    def __init__(self, plan: CellPlan, options: CellOptions, watchdog: Watchdog | None) -> None:
        self.dirs = [client_dir(plan.result_dir, k) for k in range(len(plan.client_argvs))]
        self.result_dir = plan.result_dir
        self.members = [
            ManagedProcess(
                argv,
                log_path=d / "replay.log",
                name=f"replayer (client {k})",
                stop_grace_s=options.replay_stop_grace_s,
                watchdog=watchdog,
            )
            for k, (argv, d) in enumerate(zip(plan.client_argvs, self.dirs, strict=True))
        ]
        self.failed: ManagedProcess | None = None

    @property
    def log_path(self) -> Path:
        return (self.failed or self.members[0]).log_path

    def last_lines(self, n: int) -> list[str]:
        return (self.failed or self.members[0]).last_lines(n)

    def start(self) -> ClientGroup:
        at = f"{time.time() + CLIENT_START_SLACK_S:.3f}"
        for member in self.members:
            member.argv += ["--start-at", at]
            member.start()
        return self

    def poll(self) -> int | None:
        """None while any runs; else the first non-zero exit status (0 when all succeeded)."""
        codes = [m.poll() for m in self.members]
        if any(c is None for c in codes):
            return None
        for member, code in zip(self.members, codes, strict=True):
            if code != 0:
                self.failed = member
                return code
        return 0

    def wait(self, timeout_s: float | None = None) -> int | None:
        deadline = time.monotonic() + (timeout_s or 0.0)
        for member in self.members:
            member.wait(max(0.0, deadline - time.monotonic()))
        return self.poll()

    def stop(self) -> None:
        for member in self.members:
            member.signal_group(signal.SIGTERM)  # all stop dispatching at about the same moment
        for member in self.members:
            member.stop()

    def merge(self) -> str | None:
        """Join the clients' records and summaries into the cell's; the problem, or None."""
        try:
            merge_clients([d for d in self.dirs if (d / RUN_META_FILE).is_file()], self.result_dir)
        except ResultError as err:
            return f"merging the client processes' results: {err}"
        missing = [str(k) for k, d in enumerate(self.dirs) if not (d / RUN_META_FILE).is_file()]
        if missing:
            return f"client process(es) {', '.join(missing)} left no run record ({RUN_META_FILE})"
        return None


def _watch_replay(
    engine: _Group, replayer: ManagedProcess | ClientGroup, options: CellOptions, duration: int
) -> str | None:
    """Wait for the replayer; notice a dead engine, give the replayer's circuit breaker time, then stop it."""
    timeout_s = options.replay_timeout(duration)
    replayer.start()
    deadline = time.monotonic() + timeout_s
    died_reason: str | None = None
    died_at = 0.0
    while True:
        code = replayer.wait(0.25)
        raise_if_stopped()
        if code is not None:
            break
        now = time.monotonic()
        if died_reason is None:
            died_reason = engine.died_reason()
            died_at = now
        elif now - died_at > options.engine_death_wait_s:
            replayer.stop()
            break
        if now > deadline:
            replayer.stop()
            return f"replayer still running {timeout_s:g} s after it started; stopped it"
    died_reason = died_reason or engine.died_reason()
    if died_reason:
        return died_reason
    code = replayer.poll()
    if code != 0:
        return f"replayer exited with status {code}{_hint(replayer)}"
    return None


def show_tail(log_path: Path, say: Callable[[str], None], n: int = 15) -> None:
    """Say the last ``n`` lines of a log (an engine that died: what it said last)."""
    lines = tail_lines(log_path, n)
    if lines:
        say(f"last {len(lines)} lines of {log_path.name}:")
        for line in lines:
            say(f"  | {line}")


def _first_rows(collectors: list[tuple[ManagedProcess, Path]], timeout_s: float) -> list[str]:
    """Wait until every collector has written its first row, so that each count the checks take as
    last minus first starts before the first request (a router collector that started late under load
    once read 2 requests already sent as its baseline: "r0 finished 16 requests but the router sent it
    14"); the names of those still without one after ``timeout_s`` (one that exited is not waited for)."""
    deadline = time.monotonic() + timeout_s
    waiting = list(collectors)
    while waiting:
        waiting = [(proc, path) for proc, path in waiting if proc.poll() is None and not _has_row(path)]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return [proc.name for proc, _path in waiting]


def _has_row(path: Path) -> bool:
    """Whether a collector's CSV holds its header and at least one row."""
    try:
        with path.open("rb") as fh:
            return fh.read(1 << 16).count(b"\n") >= 2
    except OSError:
        return False


def _hint(proc: ManagedProcess | ClientGroup) -> str:
    lines = [ln.strip() for ln in proc.last_lines(40) if ln.strip()]
    return f"; last line of {proc.log_path.name}: {lines[-1][:300]}" if lines else ""
