"""`agentsweep sweep --key KEY`: run a key's cells on this machine, one after another, then collect.

Exit status: 0 when every cell succeeded and collect passed, 1 when a cell failed, 3 when every cell
ran but some are INVALID (their checks failed; the report says why), 2 for bad input,
128 + the signal's number after Ctrl-C (130), SIGTERM (143) or SIGHUP (129): the current cell is stopped
cleanly (its verdict written), what finished is still collected, and --resume finishes the rest.
"""

from __future__ import annotations

import argparse
import fnmatch
import time
from pathlib import Path

from agentsweep.config import overrides
from agentsweep.contract.verdict import INVALID_EXIT
from agentsweep.errors import InputError
from agentsweep.sweep.local import (
    CellRun,
    Interrupted,
    SweepPlan,
    check_reuse,
    dry_run_lines,
    fmt_duration,
    headline_lines,
    install_stop_handlers,
    plan_sweep,
    prepare,
    run_collect,
    run_in_process,
    run_one,
    runs_in_process,
    signal_number,
)
from agentsweep.sweep.lock import sweep_lock

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_LAUNCHER = REPO_ROOT / "runners" / "launch_local.sh"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", action="append", required=True, help="config key (glob allowed; repeatable)")
    parser.add_argument("--config", help="sweep config file (default configs/agentic.yaml)")
    parser.add_argument(
        "--results", type=Path, default=Path("results"), help="results root (default: results)"
    )
    parser.add_argument("--tp", help="only these TP values (comma list)")
    parser.add_argument("--users", help="only these user counts (comma list)")
    parser.add_argument("--offload", help="only these offload modes (comma list of on, off, noprefix)")
    parser.add_argument("--max-tp", type=int, help="only cells with TP <= this")
    parser.add_argument("--duration", type=int, help="override every cell's replay duration (s)")
    parser.add_argument(
        "--clock",
        choices=("wall", "virtual"),
        help="the simulated engine's clock for every cell: wall (HTTP, the reference) or virtual (one "
        "process, no waiting; docs/virtual-clock.md)",
    )
    overrides.add_arguments(parser)
    parser.add_argument("--only", help="only cells whose exp_name matches one of these globs (comma list)")
    parser.add_argument(
        "--resume", action="store_true", help="rerun only cells whose status.txt is not SUCCESS"
    )
    parser.add_argument(
        "--force", action="store_true", help="delete the selected cells' results and rerun them"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the exact commands and run nothing")
    parser.add_argument("--no-collect", action="store_true", help="skip `agentsweep collect` at the end")
    parser.add_argument(
        "--no-plots",
        action="store_true",
        help="collect without figures (`agentsweep collect --no-plots`): report.html keeps its tables",
    )
    parser.add_argument(
        "--launcher", type=Path, default=DEFAULT_LAUNCHER, help="launcher script (runners/launch_local.sh)"
    )


def run(args: argparse.Namespace) -> int:
    from agentsweep.config.matrix import select

    if args.resume and args.force:
        raise InputError("--resume and --force contradict each other: choose one")
    if args.duration is not None and args.duration <= 0:
        raise InputError(f"--duration {args.duration}: must be > 0")
    slo = overrides.slo_tiers(args.slo)
    selection = select(
        args.config,
        args.key,
        tp=_ints("--tp", args.tp),
        users=_ints("--users", args.users),
        offload=_words(args.offload),
        max_tp=args.max_tp,
        duration=args.duration,
        max_cells=None,
        slo=slo,
        search=overrides.user_search(args.search),
        clock=args.clock,
    )
    cells = selection.cells
    tiers = {spec.key: slo or spec.slo or () for spec in selection.specs}
    if args.only:
        globs = _words(args.only) or []
        cells = [c for c in cells if any(fnmatch.fnmatchcase(c.exp_name, g) for g in globs)]
        if not cells:
            raise InputError(f"--only {args.only}: matches no cell of the selection")
    plans = plan_sweep(cells, args.results, tiers)
    if args.dry_run:
        print(
            "\n".join(
                dry_run_lines(plans, args.launcher, collect=not args.no_collect, plots=not args.no_plots)
            )
        )
        return 0
    if not args.launcher.exists():
        raise InputError(f"--launcher {args.launcher}: no such file")
    with sweep_lock(args.results):  # before anything there is deleted: one sweep per results root
        check_reuse(plans, resume=args.resume, force=args.force)
        prepare(plans, force=args.force)
        restore = install_stop_handlers()
        try:
            return _run_plans(plans, args.launcher, collect=not args.no_collect, plots=not args.no_plots)
        finally:
            restore()


def _run_plans(plans: list[SweepPlan], launcher: Path, *, collect: bool, plots: bool = True) -> int:
    all_runs = [r for p in plans for r in p.runs]
    todo = [r for r in all_runs if r.state == "pending"]
    skipped = len(all_runs) - len(todo)
    print(
        f"sweep: {len(all_runs)} cells, {len(todo)} to run"
        + (f", {skipped} already SUCCESS (skipped)" if skipped else ""),
        flush=True,
    )
    start = time.monotonic()
    interrupted: Interrupted | None = None
    try:
        for i, run in enumerate(todo, 1):
            print(f"sweep: [{i}/{len(todo)}] {run.exp_name} {_eta(todo, i, start)}", flush=True)
            try:
                if runs_in_process(run, launcher):
                    run_in_process(run, launcher.resolve().parent.parent)
                else:
                    run_one(run, launcher)
            except Interrupted as err:
                interrupted = err
                print(
                    f"sweep: [{i}/{len(todo)}] {run.exp_name} interrupted ({err}) after "
                    f"{fmt_duration(run.seconds)}",
                    flush=True,
                )
                break
            verdict = run.state + (f": {run.reason}" if run.reason else "")
            print(
                f"sweep: [{i}/{len(todo)}] {run.exp_name} {verdict} ({fmt_duration(run.seconds)})", flush=True
            )
    except KeyboardInterrupt as err:  # a signal between two cells: no cell is running
        interrupted = Interrupted(signal_number(err))
    _summary(all_runs, time.monotonic() - start)
    collect_ok, collect_invalid = True, False
    if collect:
        for plan in plans:
            code, report = run_collect(plan.key_dir, plan.tiers, plots=plots)
            collect_ok &= code in (0, INVALID_EXIT)
            collect_invalid |= code == INVALID_EXIT
            if report is not None and report.exists():
                print(f"sweep: report: {report.resolve()}", flush=True)
                for line in headline_lines(report.parent):
                    print(f"sweep: {line}", flush=True)
            else:
                where = plan.key_dir / "aggregated"
                print(f"sweep: collect wrote no report.html under {where} (exit status {code})", flush=True)
    if interrupted is not None:
        left = sum(r.state in ("pending", "interrupted") for r in all_runs)
        print(
            f"sweep: interrupted by {interrupted}; {left} cell(s) left: rerun the same command with --resume "
            "to finish them",
            flush=True,
        )
        return 128 + interrupted.signum
    failed = [r for r in all_runs if r.state not in ("SUCCESS", "done", "INVALID")]
    invalid = [r for r in all_runs if r.state == "INVALID"]
    if failed or not collect_ok:
        return 1
    return INVALID_EXIT if invalid or collect_invalid else 0


def _eta(todo: list[CellRun], i: int, start: float) -> str:
    elapsed = time.monotonic() - start
    if i == 1:
        return "(starting)"
    per_cell = elapsed / (i - 1)
    return f"(elapsed {fmt_duration(elapsed)}, about {fmt_duration(per_cell * (len(todo) - i + 1))} left)"


def _summary(runs: list[CellRun], seconds: float) -> None:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.state] = counts.get(r.state, 0) + 1
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    print(f"sweep: finished in {fmt_duration(seconds)}: {parts}", flush=True)
    for r in runs:
        if r.state in ("INVALID", "FAILED", "interrupted"):
            print(f"sweep:   {r.exp_name}: {r.state}: {r.reason}", flush=True)


def _words(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [w.strip() for w in text.split(",") if w.strip()]


def _ints(flag: str, text: str | None) -> list[int] | None:
    words = _words(text)
    if words is None:
        return None
    out = []
    for w in words:
        if not w.isdigit() or int(w) <= 0:
            raise InputError(f"{flag} {text}: {w!r} is not a positive integer")
        out.append(int(w))
    return out
