"""The local sweep: a key's cells one after another through a launcher, then collect.

Results go to ``<results>/<config_key>/<exp_name>/``; a cell is done when its status.txt says SUCCESS.
Reusing a results directory needs ``resume`` (rerun only unfinished cells; an unfinished capacity
cell keeps the steps it measured and measures only the missing ones) or ``force`` (start over).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentsweep.capacity.run import check_startable, run_planned
from agentsweep.cell.lifecycle import check_result_dir, record_refusal
from agentsweep.cell.plan import CellOptions, plan_cell
from agentsweep.cell.port_allocation import DryRunPortAllocator, FreePortAllocator
from agentsweep.cell.record import mask_cell, mask_text
from agentsweep.cell.stop import CellInterrupted, install_signal_handlers, interrupted_by
from agentsweep.collect.output import replace_folder
from agentsweep.contract.cell import CELL_ENV_VAR, Cell
from agentsweep.contract.resultdir import read_status
from agentsweep.contract.slo import SloTier
from agentsweep.errors import AgentsweepError, InputError
from agentsweep.watchdog import die_with_parent

# How long a cell may take to wind down after Ctrl-C (replayer flush + engine SIGTERM grace) before
# its process group is killed.
INTERRUPT_GRACE_S = 90.0
# The launcher of runner `local`, and the variable that points it at another cell script (tests).
LOCAL_LAUNCHER = "launch_local.sh"
CELL_SCRIPT_VAR = "AGENTSWEEP_CELL_SCRIPT"


@dataclass
class CellRun:
    """One cell of the sweep and what happened to it."""

    cell: Cell
    result_dir: Path
    # pending | done (SUCCESS before this run) | SUCCESS | INVALID | FAILED | interrupted
    state: str = "pending"
    reason: str | None = None
    seconds: float = 0.0

    @property
    def exp_name(self) -> str:
        return self.cell.exp_name


@dataclass
class SweepPlan:
    key_dir: Path
    runs: list[CellRun] = field(default_factory=list)
    # The entry's SLO tiers (its slo: block, or --slo): collect reads the grid-derived capacity
    # against them; empty: collect's own choice (the capacity cells' tiers, else the defaults).
    tiers: tuple[SloTier, ...] = ()

    @property
    def todo(self) -> list[CellRun]:
        return [r for r in self.runs if r.state == "pending"]


def plan_sweep(
    cells: Sequence[Cell], results: Path, tiers: Mapping[str, Sequence[SloTier]] | None = None
) -> list[SweepPlan]:
    """Group cells by config key and mark the ones whose result already says SUCCESS; ``tiers``: each
    key's SLO tiers, for its collect."""
    plans: dict[str, SweepPlan] = {}
    for cell in cells:
        key = cell.config_key
        plan = plans.setdefault(
            key, SweepPlan(key_dir=results.resolve() / _safe(key), tiers=tuple((tiers or {}).get(key, ())))
        )
        result_dir = plan.key_dir / cell.exp_name
        status, _ = _verdict(result_dir)
        plan.runs.append(CellRun(cell, result_dir, state="done" if status == "SUCCESS" else "pending"))
    return list(plans.values())


def check_reuse(plans: Sequence[SweepPlan], *, resume: bool, force: bool) -> None:
    """Refuse to write into a results directory that already holds results, unless told how."""
    if resume or force:
        return
    for plan in plans:
        if plan.key_dir.is_dir() and any(plan.key_dir.iterdir()):
            done = sum(r.state == "done" for r in plan.runs)
            raise InputError(
                f"{plan.key_dir} already holds results ({done} of {len(plan.runs)} selected cells SUCCESS); "
                "use --resume to run only the unfinished cells, or --force to delete them and start over"
            )


def prepare(plans: Sequence[SweepPlan], *, force: bool) -> None:
    """Clear what will be rerun: every selected cell with --force, unfinished ones with --resume. An
    unfinished capacity cell keeps the steps it measured that stand (``agentsweep.capacity.steps``):
    its search goes on from them."""
    for plan in plans:
        for run in plan.runs:
            if force:
                run.state = "pending"
            if run.state != "pending" or not run.result_dir.exists():
                continue
            if run.cell.capacity is not None and not force and run.result_dir.is_dir():
                from agentsweep.capacity.steps import keep_measured

                for line in keep_measured(run.cell, run.result_dir):
                    print(f"sweep: {run.exp_name}: {line}", flush=True)
            else:
                shutil.rmtree(run.result_dir)
        # The previous report stays readable until collect's new one replaces it (run_collect).


def launcher_env(run: CellRun, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The launcher's environment: the cell as one JSON value, where its results go, no fixed port."""
    env = dict(environ)
    env.update(_cell_env(run))
    env.pop("PORT", None)  # each cell picks a free port
    return env


def _cell_env(run: CellRun) -> dict[str, str]:
    return {CELL_ENV_VAR: run.cell.to_json(), "RESULT_DIR": str(run.result_dir)}


def dry_run_lines(
    plans: Sequence[SweepPlan], launcher: Path, *, collect: bool = True, plots: bool = True
) -> list[str]:
    """The exact commands a run would execute, cell by cell, then collect (unless ``collect`` is off)."""
    lines: list[str] = []
    for plan in plans:
        total = len(plan.runs)
        for i, run in enumerate(plan.runs, 1):
            skip = " (SUCCESS, skipped with --resume)" if run.state == "done" else ""
            lines.append(f"[BEGIN CELL {i}/{total}] {run.exp_name}{skip}")
            env = _cell_env(run)
            env[CELL_ENV_VAR] = json.dumps(mask_cell(run.cell.model_dump(mode="json")), separators=(",", ":"))
            lines.append(
                "launch:  "
                + " ".join(f"{k}={shlex.quote(mask_text(v))}" for k, v in env.items())
                + f" {launcher}"
            )
            cplan = plan_cell(run.cell, run.result_dir, ports=DryRunPortAllocator())
            lines += cplan.describe()
            if run.cell.capacity is not None:
                from agentsweep.capacity.run import describe

                lines += describe(run.cell)
            lines.append(f"[END CELL {i}/{total}]")
        if collect:
            lines.append(f"collect: {shlex.join(collect_command(plan.key_dir, plan.tiers, plots=plots))}")
    return lines


def staging_dir(key_dir: Path) -> Path:
    """Where collect writes the key's new aggregated folder, beside the key's results (not among its
    cells), before it replaces ``aggregated``; one per key (one sweep at a time holds the results root)."""
    return key_dir.parent / f".{key_dir.name}.aggregated.new"


def collect_command(
    key_dir: Path, tiers: Sequence[SloTier] = (), python: str = sys.executable, *, plots: bool = True
) -> list[str]:
    slo = [arg for tier in tiers for arg in ("--slo", tier.text())]
    figures = [] if plots else ["--no-plots"]
    return [
        python,
        "-m",
        "agentsweep.cli",
        "collect",
        str(key_dir),
        str(staging_dir(key_dir)),
        *slo,
        *figures,
    ]


class Interrupted(Exception):
    """A signal stopped the sweep; the current cell was stopped cleanly."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the sweep: handled exactly like Ctrl-C (SIGINT)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def install_stop_handlers() -> Callable[[], None]:
    """SIGTERM and SIGHUP raise StopSignal (a KeyboardInterrupt); returns a function restoring the old ones."""

    def handler(signum: int, frame: object) -> None:
        raise StopSignal(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def signal_number(err: KeyboardInterrupt) -> int:
    return err.signum if isinstance(err, StopSignal) else signal.SIGINT


def run_one(
    run: CellRun,
    launcher: Path,
    *,
    environ: Mapping[str, str] = os.environ,
    grace_s: float = INTERRUPT_GRACE_S,
) -> None:
    """Run one cell through the launcher in its own process group.

    Ctrl-C, SIGTERM or SIGHUP to the sweep stop the cell with that same signal (it writes its verdict,
    which names the signal the user sent); a second one kills its process group. The launcher gets SIGTERM should the sweep itself die outright.
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        [str(launcher)],
        env=launcher_env(run, environ),
        start_new_session=True,
        preexec_fn=die_with_parent(signal.SIGTERM),
    )
    try:
        code = proc.wait()
    except KeyboardInterrupt as err:
        signum = signal.Signals(signal_number(err))
        print(
            f"\nsweep: {signum.name}: stopping {run.exp_name} ({signum.name}, up to {grace_s:g} s;"
            " signal again to kill)",
            flush=True,
        )
        _signal(proc, signum)
        try:
            proc.wait(grace_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            _signal(proc, signal.SIGKILL)
            proc.wait()
        run.seconds = time.monotonic() - start
        status, reason = _verdict(run.result_dir)
        run.state, run.reason = "interrupted", reason or "interrupted"
        raise Interrupted(signum) from None
    run.seconds = time.monotonic() - start
    status, reason = _verdict(run.result_dir)
    if status == "SUCCESS" and code == 0:
        run.state, run.reason = "SUCCESS", None
    else:
        run.state = "INVALID" if status == "INVALID" else "FAILED"
        run.reason = reason or f"launcher exited with status {code} and left no status.txt"


def runs_in_process(run: CellRun, launcher: Path, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the sweep runs ``run`` in its own process instead of through ``launcher``: a cell on the
    virtual clock, whose run is one process anyway, when the launcher is this machine's own
    (``launch_local.sh``, no other cell script). Starting a launcher, bash and Python again for each
    such cell would cost more than the cell itself."""
    return (
        run.cell.clock == "virtual" and launcher.name == LOCAL_LAUNCHER and not environ.get(CELL_SCRIPT_VAR)
    )


def run_in_process(run: CellRun, repo: Path) -> None:
    """Run one virtual-clock cell in this process, as ``run_one`` runs a cell through the launcher:
    the same plan, files and verdict (``agentsweep cell``'s path), relative traces read from the
    repository root as the launcher runs them; the traces loaded stay loaded for the next cell.

    A stop signal (SIGINT, SIGTERM, SIGHUP) ends the cell with its verdict written, then raises
    Interrupted; input the cell refuses is its FAILED verdict, and the sweep goes on.
    """
    start = time.monotonic()
    result_dir = run.result_dir.resolve()
    print(f"sweep: cell -> {result_dir} (in this process: virtual clock)", flush=True)
    reason = refused = None
    restore = install_signal_handlers()
    try:
        with contextlib.chdir(repo):
            check_result_dir(result_dir)
            plan = plan_cell(run.cell, result_dir, ports=FreePortAllocator())
            check_startable(run.cell, result_dir)
            _status, reason = run_planned(plan, CellOptions())
    except CellInterrupted as err:  # before the run started, or as it wrote its verdict
        reason = str(err)
    except AgentsweepError as err:  # as `agentsweep cell` records a refusal
        refused = err.render()
        record_refusal(result_dir, run.cell.model_dump(mode="json"), refused)
    finally:
        restore()
        run.seconds = time.monotonic() - start
    status, written = _verdict(run.result_dir)
    run.state = status if status in ("SUCCESS", "INVALID") else "FAILED"
    run.reason = (written or refused) if status != "SUCCESS" else None
    signum = interrupted_by(reason)
    if signum is not None:
        run.state, run.reason = "interrupted", written or reason
        raise Interrupted(signum)


def _verdict(result_dir: Path) -> tuple[str | None, str | None]:
    """(verdict, first reason) of a cell's status.txt; (None, None) when there is none, and (None, what
    is wrong) when it cannot be read (a FIFO, say: never blocks)."""
    try:
        found = read_status(result_dir)
    except InputError as err:
        return None, str(err)
    return (found.verdict, found.reason) if found is not None else (None, None)


def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def run_collect(
    key_dir: Path, tiers: Sequence[SloTier] = (), *, plots: bool = True
) -> tuple[int, Path | None]:
    """Run `agentsweep collect` on the key's results into a folder beside them, then put that folder
    in place of ``aggregated`` in one step: a report someone is reading is never deleted before its
    successor is whole, and a collect that wrote nothing leaves the previous one (and says so).
    (exit status, report.html path; None when collect wrote nothing)."""
    staging = staging_dir(key_dir)
    shutil.rmtree(staging, ignore_errors=True)
    cmd = collect_command(key_dir, tiers, plots=plots)
    print(f"sweep: {shlex.join(cmd)}", flush=True)
    try:
        code = subprocess.run(cmd, check=False, preexec_fn=die_with_parent(signal.SIGTERM)).returncode
    except KeyboardInterrupt as err:
        code = 128 + signal_number(err)
    aggregated = key_dir / "aggregated"
    if (staging / "summary.csv").is_file():
        replace_folder(staging, aggregated)
        return code, aggregated / "report.html"
    shutil.rmtree(staging, ignore_errors=True)
    if aggregated.exists():
        print(f"sweep: collect wrote nothing; {aggregated} still holds the previous collect", flush=True)
    return code, None


def headline_lines(aggregated: Path) -> list[str]:
    """The collected sweep's headline (collect.headline) as plain lines, from its summary.csv and
    capacity.csv; one line saying why when it cannot be read (the sweep still ends as it would)."""
    from agentsweep.collect import headline  # pandas and collect, only once a sweep has collected

    try:
        found = headline.from_files(aggregated)
    except (OSError, ValueError) as err:
        return [f"no headline: {aggregated}: {err}"]
    return found.lines() if found is not None else []


def fmt_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in key) or "config"
