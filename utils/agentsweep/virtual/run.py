"""One simulated run in one process on virtual time: engine, replayer, metrics collector, power sampler.

The parts are the HTTP path's own, given the same command lines a cell's plan gives their processes
(so the two paths cannot drift apart in what they run with): the simulated engine's scheduler and
caches (``engine_sim``), the replayer's lanes and records (``kv_cache_tester.replay``), the
collector's row mapping (``metrics.scraper``) and the power sampler's DCGM reading
(``energy.sampler``). What changes: no process, no socket, and every clock reads the loop's virtual
time (``virtual.clock``), whose seconds stand for the wall seconds of the HTTP path at the same
``--speed``. The files written are the HTTP path's: requests.jsonl and summary.json, the engine's
start-up lines, server_metrics.csv, power.csv.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from kv_cache_tester.errors import KVTesterError
from kv_cache_tester.replay import cli as replay_cli
from kv_cache_tester.replay.app import finish, lanes_for, load, pool_for, prepare_output
from kv_cache_tester.replay.config import ReplayConfig, from_args, options_dict
from kv_cache_tester.replay.loop import Replayer
from kv_cache_tester.replay.memory import check_prompt_memory
from kv_cache_tester.replay.process import make_builder
from kv_cache_tester.replay.recorder import Recorder
from kv_cache_tester.replay.summary import RunMeta
from kv_cache_tester.traces.loaders import LoadResult, load_traces
from kv_cache_tester.traces.model import Trace
from prometheus_client import CollectorRegistry

from agentsweep.contract.cell import VIRTUAL_ROUTER_POLICIES
from agentsweep.energy import cli_sampler
from agentsweep.energy.sampler import Sampler
from agentsweep.engine_sim import cli as engine_cli
from agentsweep.engine_sim.server import SimServer
from agentsweep.errors import InputError, WriteError
from agentsweep.metrics import cli as metrics_cli
from agentsweep.metrics.dialects import Exposition, read_families
from agentsweep.metrics.scraper import Scraper
from agentsweep.virtual.clock import LoopClock, VirtualTimeLoop, run_virtual
from agentsweep.virtual.endpoint import LocalEndpoint, RoutedEndpoint
from agentsweep.watchdog import STOP_SIGNALS

# Engine flags the in-process engine cannot honour: there is no process to crash or start slowly, and
# no connection for a stalled response to hold open.
UNSUPPORTED_ENGINE_FLAGS = {
    "crash_after": "--crash-after",
    "stall_after": "--stall-after",
    "slow_start": "--slow-start",
}
# How the collector or the power sampler fails on its own (its file cannot be written, say): the
# run's reason, as that process exiting would be on the wall clock.
READER_FAILURES = (KVTesterError, OSError)
PROGRESS_EVERY_S = 5.0  # real seconds between progress lines (a short run prints none)
SETTLE_S = 5.0  # virtual seconds the engine gets to retire aborted requests before the last scrape


@dataclass(frozen=True, slots=True)
class LocalInstance:
    """One engine instance's parts as their flags: the engine, its log, its metrics collector."""

    engine_flags: list[str]
    server_log: Path
    metrics_flags: list[str]
    metrics_log: Path | None = None  # the collector's own lines (default: the replay log)
    name: str = ""  # "" for a cell's one engine; r<i> behind a router
    metrics_url: str = ""  # its /metrics URL in the plan: the power sampler's targets name it


@dataclass(frozen=True, slots=True)
class LocalRouter:
    """The router in front of several instances: its policy (``contract.cell.VIRTUAL_ROUTER_POLICIES``) and where
    its per-instance request counts go (router_metrics.csv), as its collector would write them."""

    policy: str
    output: Path
    interval_s: float


@dataclass(frozen=True, slots=True)
class LocalRun:
    """A run's parts as their command-line flags (what follows the subcommand in each argv)."""

    instances: list[LocalInstance]  # one engine, or the replicas behind ``router``
    replay_flags: list[str]
    replay_log: Path
    power_flags: list[str] | None = None
    router: LocalRouter | None = None


def _parse(what: str, add: Callable[[argparse.ArgumentParser], None], flags: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=what, add_help=False, exit_on_error=False)
    add(parser)
    try:
        return parser.parse_args(flags)
    except (argparse.ArgumentError, SystemExit) as err:
        raise InputError(f"virtual clock: the {what} flags {' '.join(flags)!r} do not parse: {err}") from None


@dataclass(slots=True)
class _Engine:
    """One instance's parsed flags."""

    spec: LocalInstance
    engine: argparse.Namespace
    setup: engine_cli.Setup
    metrics: argparse.Namespace


@dataclass(slots=True)
class _Parts:
    engines: list[_Engine]
    replay: ReplayConfig
    replay_options: dict[str, object]
    power: argparse.Namespace | None
    router: LocalRouter | None

    @property
    def first(self) -> _Engine:
        return self.engines[0]


def _engine(spec: LocalInstance) -> _Engine:
    engine = _parse("engine-sim", engine_cli.add_arguments, spec.engine_flags)
    for attr, flag in UNSUPPORTED_ENGINE_FLAGS.items():
        if getattr(engine, attr, None):
            raise InputError(
                f"virtual clock: engine-sim {flag} needs the engine in its own process; run this cell "
                "with clock: wall"
            )
    if engine.disaggregation_mode != "null":
        raise InputError("virtual clock: disaggregated prefill/decode runs with clock: wall only")
    metrics = _parse("metrics-collector", metrics_cli.add_arguments, spec.metrics_flags)
    return _Engine(spec, engine, engine_cli.resolve(engine), metrics)


def _parts(run: LocalRun) -> _Parts:
    if not run.instances:
        raise InputError("virtual clock: a run needs an engine")
    if run.router is None and len(run.instances) > 1:
        raise InputError("virtual clock: several engine instances need a router")
    if run.router is not None and run.router.policy not in VIRTUAL_ROUTER_POLICIES:
        raise InputError(
            f"virtual clock: router policy {run.router.policy} keeps the router program's own state (its "
            f"prefix tree); the in-process router runs {', '.join(VIRTUAL_ROUTER_POLICIES)}: run this cell with "
            "clock: wall"
        )
    engines = [_engine(spec) for spec in run.instances]
    replay_ns = _parse("replay", replay_cli.add_arguments, run.replay_flags)
    replay = from_args(replay_ns)
    if replay.workers > 1 or replay.client_count > 1:
        raise InputError("virtual clock: the replay runs in one process (no --workers, one client)")
    power = _parse("power-sampler", cli_sampler.add_arguments, run.power_flags) if run.power_flags else None
    return _Parts(engines, replay, options_dict(replay_ns), power, run.router)


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[TextIO]:
    """The replayer's own lines (``kv_cache_tester.replay.app.log``) go to its log, as in its process."""
    with path.open("a", encoding="utf-8") as fh, contextlib.redirect_stderr(fh):
        yield fh


@dataclass(frozen=True, slots=True)
class LocalOutcome:
    """How a run ended: why it failed (None: it did not), and the signal that stopped it, if one did."""

    reason: str | None
    signum: int | None = None


def run_local(run: LocalRun, say: Callable[[str], None]) -> LocalOutcome:
    """Run it to the end, or until SIGINT/SIGTERM/SIGHUP: the replay then stops as its process would
    (requests in flight get the grace period) and every file is whole. Raises InputError for flags it
    cannot run."""
    parts = _parts(run)
    _write_startup(run, parts)
    with _stderr_to(run.replay_log):
        try:
            traces = load(parts.replay, kept_traces)
            check_prompt_memory(
                traces, parts.replay.users, parts.replay.prompt_mode, parts.replay.max_prompt_memory
            )
            out = prepare_output(parts.replay)
            meta, sampling_problem = run_virtual(lambda loop: _run(loop, parts, traces, out, say))
            options = {**parts.replay_options, "resolved_model": _model(parts)}
            code = finish(parts.replay, out, [meta], options)
        except KVTesterError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            return LocalOutcome(f"replayer: {err}")
    if meta.signum:
        return LocalOutcome(f"stopped by signal {meta.signum}", meta.signum)
    if code != 0:
        return LocalOutcome(f"replayer exited with status {code}")
    return LocalOutcome(sampling_problem)


# Loaded traces kept for the next run in this process (a capacity search's steps, a benchmark's cells):
# parsing the shipped traces is about a third of a short run's CPU.
_KEPT: dict[tuple[object, ...], LoadResult] = {}


def kept_traces(source: str | Path, **options: Any) -> LoadResult:
    """``load_traces``, kept while the trace files stand unchanged (their names, sizes and times)."""
    path = Path(source)
    if not path.exists():  # a dataset: loaded as it is
        return load_traces(source, **options)
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file())
    key = (str(path.resolve()), stamp, tuple(sorted(options.items())))
    if key not in _KEPT:
        _KEPT.clear()  # one trace set at a time: a process running many sets keeps no more
        _KEPT[key] = load_traces(source, **options)
    return _KEPT[key]


def _model(parts: _Parts) -> str:
    first = parts.first
    return parts.replay.model or (first.engine.served_model_name or [first.setup.model])[0]


def _write_startup(run: LocalRun, parts: _Parts) -> None:
    """Each engine's start-up lines, as its process logs them (a cell reads its settings there)."""
    for eng in parts.engines:
        lines = [*engine_cli.startup_lines(eng.engine, eng.setup)]
        lines.append(engine_cli.settings_line(eng.engine, eng.setup, eng.engine.port))
        lines.append("Running in this process on a virtual clock: no server, no socket")
        log = eng.spec.server_log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w", encoding="utf-8") as fh:
            fh.writelines(f"INFO {line}\n" for line in lines)


async def _run(
    loop: VirtualTimeLoop, parts: _Parts, traces: list[Trace], out: Path, say: Callable[[str], None]
) -> tuple[RunMeta, str | None]:
    """The replay's meta, and why a collector or the power sampler stopped early (None: none did)."""
    cfg = parts.replay
    servers = [
        engine_cli.build_server(eng.engine, eng.setup, LoopClock(loop, eng.engine.speed))
        for eng in parts.engines
    ]
    for server in servers:
        server.engine.start()
    chat = cfg.api == "chat"
    router: RoutedEndpoint | None = None
    endpoint: LocalEndpoint | RoutedEndpoint
    if parts.router is not None:
        endpoint = router = RoutedEndpoint(servers, parts.router.policy, chat, loop.time, seed=cfg.seed)
    else:
        endpoint = LocalEndpoint(servers[0], chat, loop.time)
    logs = [eng.spec.metrics_log for eng in parts.engines]
    opened = {path: path.open("a", encoding="utf-8") for path in dict.fromkeys(logs) if path is not None}
    sampling = _Sampling(
        loop, servers, parts, [opened[p] if p is not None else sys.stderr for p in logs], router
    )
    replayer = Replayer(
        cfg,
        traces,
        lanes_for(cfg),
        pool_for(cfg, len(traces)),
        make_builder(cfg, _model(parts)),
        Recorder(out, cfg.debug_trace),
        clock=loop.time,
        unix_clock=loop.unix,
        endpoint=endpoint,
    )
    # While the loop runs, a stop signal stops the replay as its own process would; then the
    # handlers the caller had are back. The signal is kept as it arrives: one that lands as the replay
    # ends (its stop scheduled on a loop that no longer runs it) still ends the run as stopped.
    received: list[int] = []

    def on_stop(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        loop.call_soon_threadsafe(replayer.on_signal, signum)

    previous = {sig: signal.signal(sig, on_stop) for sig in STOP_SIGNALS}
    ticker = loop.create_task(_progress(loop, replayer, cfg, say))
    problem: str | None = None
    try:
        sampling.start()
        await asyncio.sleep(sampling.lead)
        meta = await replayer.run()
        await _settle(servers)
    finally:
        ticker.cancel()
        replayer.recorder.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            problem = await sampling.stop()
            for server in servers:
                await server.engine.stop()
        finally:
            for fh in opened.values():
                fh.close()
    if received and not meta.signum:
        meta.signum = received[0]
    return meta, problem


async def _settle(servers: list[SimServer]) -> None:
    """Until no engine holds a request (aborted ones leave at its next step), at most SETTLE_S."""
    engines = [server.engine for server in servers]
    loop = asyncio.get_running_loop()
    end = loop.time() + SETTLE_S / engines[0].clock.speed
    while any(e.num_running or e.num_waiting for e in engines) and loop.time() < end:
        await asyncio.sleep(0.01)


async def _progress(
    loop: VirtualTimeLoop, replayer: Replayer, cfg: ReplayConfig, say: Callable[[str], None]
) -> None:
    """A line at most every PROGRESS_EVERY_S of real time, on a tenth of the run's duration: how far
    the virtual clock is, and what finished."""
    step = max(1.0, (cfg.test_duration or 60.0) / 10)
    last = time.monotonic()
    while True:
        await asyncio.sleep(step)
        if replayer.started and time.monotonic() - last >= PROGRESS_EVERY_S:
            last = time.monotonic()
            snap = replayer.snapshot()
            say(
                f"virtual {loop.time() - replayer.t0:.0f}/{cfg.test_duration:g} s: {snap['done']} requests done, "
                f"{snap['failed']} failed, {snap['in_flight']} in flight"
            )


class _Sampling:
    """The metrics collectors' (one per engine, and the router's) and the power sampler's readings,
    taken on the virtual clock."""

    def __init__(
        self,
        loop: VirtualTimeLoop,
        servers: list[SimServer],
        parts: _Parts,
        logs: list[TextIO],
        router: RoutedEndpoint | None,
    ) -> None:
        self.loop = loop
        self.servers = servers
        self.scrapers: list[Scraper] = []
        # (who, interval, reading): each reader by the name its process would give
        self._readers: list[tuple[str, float, Callable[[], None]]] = []
        for k, (eng, log) in enumerate(zip(parts.engines, logs, strict=True)):
            m = eng.metrics
            who = f"metrics collector of {eng.spec.name}" if eng.spec.name else "metrics collector"
            endpoint = (
                f"engine-sim {eng.spec.name} (in process)" if eng.spec.name else "engine-sim (in process)"
            )
            self.scrapers.append(Scraper(endpoint, m.output, m.interval, dialect=m.dialect, log=log))
            self._readers.append((who, float(m.interval), self._scrape_of(k)))
        self.router = router
        self._router_rows: _RouterRows | None = None
        if router is not None and parts.router is not None:
            names = [eng.spec.name for eng in parts.engines]
            self._router_rows = _RouterRows(parts.router.output, parts.router.interval_s, names, logs[0])
            self._readers.append(("metrics collector of the router", parts.router.interval_s, self._route))
        self.power: tuple[Sampler, float] | None = None
        self._dcgm_views: dict[str, CollectorRegistry] = {}
        if parts.power is not None:
            spec = cli_sampler.spec_of(parts.power)
            if spec.source != "dcgm":
                raise InputError(f"virtual clock: power source {spec.source} is a real GPU's; use dcgm")
            self.power = (Sampler(spec, parts.power.output, logs[0]), spec.interval_s)
            # The simulated GPUs' metrics alone, as a DCGM exporter serves them (reading the engine's
            # whole exposition twice a second would be most of a short run's CPU), by the endpoint
            # each target names (one engine: every target is its).
            for target in spec.targets:
                k = next((k for k, e in enumerate(parts.engines) if e.spec.metrics_url == target.endpoint), 0)
                self._dcgm_views[target.endpoint] = servers[k].gpu_exporter or servers[k].registry
            self._readers.append(("power sampler", spec.interval_s, self._sample))
        self._tasks: list[tuple[str, asyncio.Task[None]]] = []
        self._fds: list[int] = []

    @property
    def lead(self) -> float:
        """How long after the readers' first readings the replay starts: a quarter of the shortest
        reader's interval.

        On the wall clock the replay waits for every collector's first row too. Here the readers
        tick at exact multiples of their intervals from that first reading, and the replay's window
        ends exactly ``duration`` after it starts: started with the readers, its end would fall on a
        reading, and the millisecond that reading is dated to would decide which side of the edge
        it falls on, so the same run would give other server and power figures from one start to
        the next. A quarter interval keeps every edge the duration sets off every tick.
        """
        return min(interval for _, interval, _ in self._readers) / 4

    def start(self) -> None:
        try:
            for scraper in self.scrapers:
                self._fds.append(scraper.open_output())
            if self._router_rows is not None:
                self._fds.append(self._router_rows.open_output())
        except BaseException:
            self._close()
            raise
        self._tasks = [
            (who, self.loop.create_task(self._every(every, take))) for who, every, take in self._readers
        ]

    def _scrape_of(self, k: int) -> Callable[[], None]:
        def scrape() -> None:
            expo = read_families(self.servers[k].registry.collect())
            self.scrapers[k].record(self._fds[k], self.loop.unix(), expo)

        return scrape

    def _route(self) -> None:
        assert self._router_rows is not None and self.router is not None
        self._router_rows.record_counts(self._fds[-1], self.loop.unix(), self.router.counts)

    def _sample(self) -> None:
        assert self.power is not None
        sampler = self.power[0]
        read: dict[str, Exposition] = {}
        try:
            for target in sampler.spec.targets:
                if target.endpoint not in read:
                    read[target.endpoint] = read_families(self._dcgm_views[target.endpoint].collect())
                sampler.record_dcgm(target, target.gpus, read[target.endpoint], self.loop.unix())
        except OSError as err:  # power.csv cannot be written (a full disk): named as the collector's is
            raise WriteError(sampler.output, err) from None

    async def _every(self, interval: float, take: Callable[[], None]) -> None:
        while True:
            take()
            await asyncio.sleep(interval)

    async def stop(self) -> str | None:
        """The last readings, taken together (the counters as they stood when the replay ended); why
        a reader stopped early or could not take them (a full disk), named as that reader's process
        exiting would be, else None."""
        for _, task in self._tasks:
            task.cancel()
        ended = await asyncio.gather(*(task for _, task in self._tasks), return_exceptions=True)
        for err in ended:  # a bug is raised; a reader's own failure (a full disk) is the run's reason
            if isinstance(err, Exception) and not isinstance(err, READER_FAILURES):
                raise err
        failed = [
            (who, e) for (who, _), e in zip(self._tasks, ended, strict=True) if isinstance(e, READER_FAILURES)
        ]
        if self._fds:
            try:
                for who, _, take in self._readers:
                    try:
                        take()
                    except READER_FAILURES as err:
                        failed.append((who, err))
            finally:
                self._close()
                if self.power is not None:
                    sampler = self.power[0]
                    try:
                        sampler.close()  # its last buffered rows: a full disk says so here
                    except OSError as err:
                        failed.append(("power sampler", WriteError(sampler.output, err)))
        if failed:
            who, first = failed[0]
            return f"{who} (in process): {type(first).__name__}: {first}"
        return None

    def _close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


class _RouterRows(Scraper):
    """router_metrics.csv as the router's collector writes it: the requests sent to each instance so
    far, a row per reading."""

    def __init__(self, output: Path, interval_s: float, names: list[str], log: TextIO) -> None:
        super().__init__("in-process router", output, interval_s, log=log)
        self.columns = ("time_s", *(f"requests.{name}" for name in names))

    def record_counts(self, fd: int, now: float, counts: list[int]) -> None:
        self._append(fd, [f"{now:.3f}", *(f"{c:g}" for c in counts)])
        self.stats.ok += 1
