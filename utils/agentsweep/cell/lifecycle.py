"""One cell's lifecycle: engine -> health wait -> scraper -> replayer -> stop all -> cell.json + status.txt.

``plan_cell`` resolves every command once (the dry run prints exactly this plan); ``run_cell`` executes it
and writes the verdict on every exit path: success, failure, a bug, SIGTERM/SIGINT.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from kv_cache_tester.replay import ResultError, load_summary, write_summary

import agentsweep
from agentsweep.cell import record, replicas
from agentsweep.cell.clients import client
from agentsweep.cell.engine_process import EngineFailed, EngineProcess, ManagedProcess, tail_lines, trim_log
from agentsweep.cell.engines import build_engine_launch, recipe
from agentsweep.cell.plan import CellOptions, CellPlan
from agentsweep.cell.routers import router_recipe
from agentsweep.cell.watchdog import Watchdog
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import (
    CELL_JSON,
    PREFILL_METRICS_CSV,
    REQUESTS_JSONL,
    SERVER_METRICS_CSV,
    STATUS_TXT,
    SUMMARY_JSON,
)
from agentsweep.contract.verdict import Verdict
from agentsweep.errors import ConfigError, InputError
from agentsweep.validity import evaluate

RESULT_FILES = (CELL_JSON, STATUS_TXT, REQUESTS_JSONL, SUMMARY_JSON)


class CellInterrupted(Exception):
    """SIGTERM, SIGINT or SIGHUP reached the cell; unwinding stops every child and still writes the verdict."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def resolve_hardware(cell: Cell, runners_path: Path | None = None) -> str | None:
    """The runner's GRES type (h200|b200|mi355x) from configs/runners.yaml; None for a local runner."""
    from agentsweep.config import load_runners

    runners = load_runners(runners_path)
    if cell.runner not in runners:
        raise ConfigError(
            f"cell.runner: {cell.runner!r} is not a runner in runners.yaml "
            f"(known: {', '.join(sorted(runners))})"
        )
    hardware = runners[cell.runner].hardware
    return str(hardware) if hardware else None


def resolve_kv_transfer_gbs(cell: Cell, runners_path: Path | None = None) -> float | None:
    """The runner's KV transfer bandwidth per GPU for a disaggregated cell: ``intra_node_gbs`` on one
    node, ``inter_node_gbs`` when the cell spans several; None for any other cell."""
    if not cell.disaggregated:
        return None
    from agentsweep.config import load_runners

    runners = load_runners(runners_path)
    if cell.runner not in runners:
        raise ConfigError(
            f"cell.runner: {cell.runner!r} is not a runner in runners.yaml "
            f"(known: {', '.join(sorted(runners))})"
        )
    spec = runners[cell.runner]
    return float(spec.inter_node_gbs if cell.nodes > 1 else spec.intra_node_gbs)


def plan_cell(
    cell: Cell,
    result_dir: Path,
    *,
    port: int | str,
    hardware: str | None,
    host: str = "127.0.0.1",
    python: str = sys.executable,
    environ: Mapping[str, str] = os.environ,
    scrape_interval_s: float = 1.0,
    kv_transfer_gbs: float | None = None,
) -> CellPlan:
    """Resolve every command of ``cell``; ``kv_transfer_gbs`` is the runner's KV transfer bandwidth per
    GPU for a disaggregated cell (``resolve_kv_transfer_gbs``)."""
    scaleout = None
    if cell.routed:
        scaleout = replicas.plan_scaleout(
            cell,
            result_dir,
            port=port,
            hardware=hardware,
            host=host,
            python=python,
            environ=environ,
            scrape_interval_s=scrape_interval_s,
            kv_transfer_gbs=kv_transfer_gbs,
        )
        engine = scaleout.client.engine
    else:
        engine = build_engine_launch(
            cell, hardware=hardware, port=port, host=host, python=python, environ=environ
        )
    base_url = f"http://{host}:{port}"
    replay = client(cell.client).command(
        cell, engine=recipe(cell.engine), endpoint=base_url, output_dir=result_dir, python=python
    )
    scraper = [
        python,
        "-m",
        "agentsweep.cli",
        "metrics-collector",
        "--endpoint",
        base_url + engine.metrics_path,
        "--output",
        str(result_dir / SERVER_METRICS_CSV),
        "--interval",
        f"{scrape_interval_s:g}",
    ]
    return CellPlan(cell, result_dir, port, hardware, engine, replay, scraper, base_url, scaleout=scaleout)


def check_result_dir(result_dir: Path) -> None:
    """Refuse a directory that already holds a cell's results (nothing is overwritten silently)."""
    if result_dir.exists() and not result_dir.is_dir():
        raise InputError(f"RESULT_DIR={result_dir}: exists and is not a directory")
    present = [name for name in RESULT_FILES if (result_dir / name).exists()]
    if present:
        raise InputError(
            f"RESULT_DIR={result_dir}: already holds a cell result ({', '.join(present)}); use an empty directory"
        )


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def install_signal_handlers() -> Callable[[], None]:
    """SIGTERM/SIGINT/SIGHUP raise CellInterrupted once; later ones are ignored so cleanup can finish."""

    def handler(signum: int, frame: FrameType | None) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise CellInterrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def run_cell(
    plan: CellPlan, options: CellOptions, *, log: Callable[[str], None] | None = None
) -> tuple[str, str | None]:
    """Run the plan; returns (status, reason) after writing cell.json and status.txt."""
    shout = log or (lambda line: print(f"[cell {plan.cell.exp_name}] {line}", flush=True))
    secrets = record.secret_values() | record.secret_values(plan.engine.env)

    def say(line: str) -> None:
        shout(record.mask_text(line, secrets))

    plan.result_dir.mkdir(parents=True, exist_ok=True)
    start_utc = record.utc_now()
    versions: dict[str, str | None] = {
        "agentsweep": agentsweep.__version__,
        "kv_cache_tester": _kv_cache_tester_version(),
        "engine": None,
    }
    status: Verdict = "FAILED"
    reason: str | None = "the cell did not finish"
    reasons: list[str] = []
    # Should this process die outright, the watchdog stops the children before anyone writes a verdict.
    watchdog = Watchdog(plan.result_dir)
    try:
        watchdog.start()
        reason = _execute(plan, options, versions, say, watchdog)
        if reason is None:
            reasons = _judge(plan)
            status = "INVALID" if reasons else "SUCCESS"
        else:
            reasons = [reason]
    except CellInterrupted as err:
        reason = str(err)
    except EngineFailed as err:
        reason = str(err)
        _show_tail(plan.result_dir / "server.log", say)
    except Exception as err:  # a bug or an unexpected OS error: still leave a verdict
        reason = f"{type(err).__name__}: {err}"
        raise
    finally:
        watchdog.dismiss()  # every child is stopped: nothing writes into result_dir after the verdict
        if status == "FAILED":
            reasons = [reason or "unknown failure"]
        trim_log(plan.result_dir / "server.log")
        record.write_result(
            plan.result_dir,
            cell=plan.cell.model_dump(mode="json"),
            engine_command=plan.engine.argv,
            engine_env=plan.engine.env,
            replay_command=plan.replay_argv,
            versions=versions,
            start_utc=start_utc,
            status=status,
            reasons=reasons,
            extra={"scaleout": plan.scaleout.to_record()} if plan.scaleout else None,
        )
        say(status + (f": {'; '.join(reasons)}" if reasons else ""))
    return status, "; ".join(reasons) or None


def cached_metrics_file(plan: CellPlan) -> str:
    """The scrapes the client's cached tokens are checked against (see validity.checks.evaluate)."""
    so = plan.scaleout
    if (
        so is not None
        and so.mode == "pd"
        and router_recipe(so.router.program).pd_cached_tokens_from == "prefill"
    ):
        return PREFILL_METRICS_CSV
    return SERVER_METRICS_CSV


def _judge(plan: CellPlan) -> list[str]:
    """Run the validity checks, record them in summary.json, and return the failed checks' reasons."""
    validity = evaluate(plan.result_dir, plan.cell, cached_metrics_file(plan))
    summary = load_summary(plan.result_dir, required=("counts",))
    summary["validity"] = validity.to_dict()
    write_summary(plan.result_dir, summary)
    return validity.reasons


def _execute(
    plan: CellPlan,
    options: CellOptions,
    versions: dict[str, str | None],
    say: Callable[[str], None],
    watchdog: Watchdog | None = None,
) -> str | None:
    if plan.scaleout is not None:
        return replicas.execute(plan, options, versions, say, _watch_replay, _check_outputs)
    cell = plan.cell
    rd = plan.result_dir
    engine = EngineProcess(
        plan.engine.argv,
        log_path=rd / "server.log",
        base_url=plan.base_url,
        health_path=plan.engine.health_path,
        env={**os.environ, **plan.engine.env},
        stop_grace_s=options.engine_grace(cell.engine),
        watchdog=watchdog,
    )
    say(f"starting engine: {shlex.join(record.mask_argv(plan.engine.argv))}")
    with engine:
        waited = engine.wait_healthy(options.health_timeout(cell.engine))
        say(f"engine healthy after {waited:.1f} s")
        versions["engine"] = recipe(cell.engine).version(plan.base_url)
        scraper = ManagedProcess(
            plan.scraper_argv,
            log_path=rd / "metrics-collector.log",
            name="metrics collector",
            stop_grace_s=10.0,
            watchdog=watchdog,
        )
        with scraper:
            replayer = ManagedProcess(
                plan.replay_argv,
                log_path=rd / "replay.log",
                name="replayer",
                stop_grace_s=options.replay_stop_grace_s,
                watchdog=watchdog,
            )
            say(f"replaying {cell.users} users for {cell.duration} s")
            try:
                reason = _watch_replay(engine, replayer, options, cell.duration)
            finally:
                replayer.stop()  # no-op when it already exited; on an interrupt it flushes its files
            if reason is None and scraper.poll() is not None:
                reason = f"metrics collector exited early with status {scraper.poll()}{_hint(scraper)}"
        if engine.poll() is not None:  # died on its own during the replay
            _show_tail(rd / "server.log", say)
    return reason or _check_outputs(rd)


def _watch_replay(
    engine: EngineProcess, replayer: ManagedProcess, options: CellOptions, duration: int
) -> str | None:
    """Wait for the replayer; notice a dead engine, give the replayer's circuit breaker time, then stop it."""
    timeout_s = options.replay_timeout(duration)
    replayer.start()
    deadline = time.monotonic() + timeout_s
    died_reason: str | None = None
    died_at = 0.0
    while True:
        code = replayer.wait(0.25)
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


def _check_outputs(result_dir: Path) -> str | None:
    if not (result_dir / REQUESTS_JSONL).exists():
        return f"the replayer left no {REQUESTS_JSONL}"
    if not (result_dir / SUMMARY_JSON).exists():
        return f"the replayer left no {SUMMARY_JSON}"
    try:
        counts = load_summary(result_dir, required=("counts",))["counts"]
    except ResultError as err:
        return str(err)
    if not counts.get("sent") and not counts.get("warmup"):
        return "the replayer sent no request"
    if not counts.get("ok") and counts.get("failed"):
        by_class = ", ".join(f"{k} {v}" for k, v in sorted((counts.get("failed_by_class") or {}).items()))
        return (
            f"every request in the profiling window failed ({counts['failed']}: {by_class or 'unclassified'})"
        )
    # ok == 0 with no failure: the engine finished nothing inside the window (overloaded); that is a
    # measurement, not a broken cell.
    return None


def _show_tail(log_path: Path, say: Callable[[str], None], n: int = 15) -> None:
    lines = tail_lines(log_path, n)
    if lines:
        say(f"last {len(lines)} lines of {log_path.name}:")
        for line in lines:
            say(f"  | {line}")


def _hint(proc: ManagedProcess) -> str:
    lines = [ln.strip() for ln in proc.last_lines(40) if ln.strip()]
    return f"; last line of {proc.log_path.name}: {lines[-1][:300]}" if lines else ""


def _kv_cache_tester_version() -> str | None:
    try:
        import kv_cache_tester
    except ImportError:
        return None
    return str(getattr(kv_cache_tester, "__version__", None))
