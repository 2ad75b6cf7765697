"""One cell's lifecycle: run its plan, check what the client left, judge it -> cell.json + status.txt,
then receipt.json over the whole directory.

``agentsweep.cell.plan.plan_cell`` resolves every command once (the dry run prints exactly this plan);
``run_cell`` has ``agentsweep.cell.executor.execute`` run it and writes the verdict and the receipt on
every exit path: success, failure, a bug, SIGTERM/SIGINT.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kv_cache_tester.replay import ResultError, load_summary, write_summary

import agentsweep
from agentsweep.cell import record, space
from agentsweep.cell.accuracy_step import accuracy_check
from agentsweep.cell.clients import client
from agentsweep.cell.effective import Stated, expected_settings, mismatches
from agentsweep.cell.engine_process import EngineFailed
from agentsweep.cell.executor import execute, show_tail
from agentsweep.cell.in_process import execute_in_process
from agentsweep.cell.plan import CellOptions, CellPlan, instance_shapes
from agentsweep.cell.routers import router_recipe
from agentsweep.cell.stop import CellInterrupted, raise_if_stopped
from agentsweep.contract.cell import Cell
from agentsweep.contract.figures import summary_figures
from agentsweep.contract.receipt import write_receipt
from agentsweep.contract.resultdir import (
    CAPACITY_JSON,
    CELL_JSON,
    PREFILL_METRICS_CSV,
    RECEIPT_JSON,
    REQUESTS_JSONL,
    SERVER_LOG,
    SERVER_METRICS_CSV,
    STATUS_TXT,
    SUMMARY_JSON,
)
from agentsweep.contract.verdict import Check, Verdict
from agentsweep.energy.summary import cell_power_summary
from agentsweep.errors import AgentsweepError, InputError
from agentsweep.images.local import image_record
from agentsweep.validity import evaluate
from agentsweep.watchdog import Watchdog

RESULT_FILES = (CELL_JSON, STATUS_TXT, REQUESTS_JSONL, SUMMARY_JSON, CAPACITY_JSON, RECEIPT_JSON)


def check_result_dir(result_dir: Path) -> None:
    """Refuse a directory that already holds a cell's results (nothing is overwritten silently)."""
    if result_dir.exists() and not result_dir.is_dir():
        raise InputError(f"RESULT_DIR={result_dir}: exists and is not a directory")
    present = [name for name in RESULT_FILES if (result_dir / name).exists()]
    if present:
        raise InputError(
            f"RESULT_DIR={result_dir}: already holds a cell result ({', '.join(present)}); use an empty directory"
        )


def record_refusal(result_dir: Path, raw: dict[str, object], reason: str) -> None:
    """A cell refused before it ran (bad input, a kept step it cannot stand on) still leaves its
    FAILED verdict, its cell.json with the cell as given and its receipt, when its result directory is
    usable; never raises."""
    try:
        check_result_dir(result_dir)
        record.write_result(
            result_dir,
            cell=raw,
            engine_command=[],
            engine_env={},
            replay_command=[],
            versions={},
            start_utc=record.utc_now(),
            status="FAILED",
            reasons=[reason],
            extra=image_record(raw, os.environ),
        )
        seal(result_dir, _typed_or_raw(raw), None, lambda line: None)
    except (AgentsweepError, OSError):
        pass


def _typed_or_raw(raw: dict[str, object]) -> Cell | dict[str, object]:
    """The cell typed when it is a valid one (refused later, for its port say), else as given."""
    try:
        return Cell.parse(raw)
    except AgentsweepError:
        return raw


def execute_virtual(
    plan: CellPlan,
    versions: dict[str, str | None],
    say: Callable[[str], None],
    stated: dict[str, Stated | None] | None = None,
) -> str | None:
    """Run ``plan`` on the virtual clock (``in_process``); why the run failed, or None. A stop signal
    that ended it early unwinds as on the wall clock (CellInterrupted), its files whole."""
    outcome = execute_in_process(plan, versions, say, stated)
    if outcome.signum is not None:
        raise CellInterrupted(outcome.signum)
    raise_if_stopped()  # one whose exception the event loop swallowed (raised inside a callback)
    return outcome.reason


def cell_voice(plan: CellPlan, log: Callable[[str], None] | None = None) -> Callable[[str], None]:
    """How a cell speaks: ``[cell EXP_NAME] line`` on stdout (or ``log``), every secret masked."""
    shout = log or (lambda line: print(f"[cell {plan.cell.exp_name}] {line}", flush=True))
    secrets = record.secret_values() | record.secret_values(plan.engine.env)

    def say(line: str) -> None:
        shout(record.mask_text(line, secrets))

    return say


def start_versions() -> dict[str, str | None]:
    """The versions cell.json records, the engine's filled in once it answers."""
    return {
        "agentsweep": agentsweep.__version__,
        "kv_cache_tester": kv_cache_tester_version(),
        "engine": None,
    }


def run_cell(
    plan: CellPlan, options: CellOptions, *, log: Callable[[str], None] | None = None
) -> tuple[str, str | None]:
    """Run the plan; returns (status, reason) after writing cell.json, status.txt and receipt.json."""
    say = cell_voice(plan, log)
    plan.result_dir.mkdir(parents=True, exist_ok=True)
    start_utc = record.utc_now()
    versions = start_versions()
    status: Verdict = "FAILED"
    reason: str | None = "the cell did not finish"
    reasons: list[str] = []
    # Should this process die outright, the watchdog stops the children before anyone writes a verdict.
    watchdog = Watchdog(plan.result_dir)
    stated: dict[str, Stated | None] = {}
    try:
        space.reserve(plan.result_dir)  # room for the verdict should the run fill the disk
        watchdog.start()
        if plan.cell.clock == "virtual":
            reason = execute_virtual(plan, versions, say, stated)
        else:
            reason = execute(plan, options, versions, say, watchdog, stated)
        raise_if_stopped()  # a stop whose exception was dropped: not judged as a whole run
        reason = reason or check_outputs(plan.result_dir)
        if reason is None:
            reasons = judge(plan, stated)
            status = "INVALID" if reasons else "SUCCESS"
            if plan.cell.capacity is None:
                say(_figures_line(plan))
            if plan.power is not None:
                say(_power_line(plan))
        else:
            reasons = [reason]
    except CellInterrupted as err:
        reason = str(err)
    except EngineFailed as err:
        reason = str(err)
        show_tail(plan.result_dir / SERVER_LOG, say)
    except OSError as err:
        status = "FAILED"
        if not space.is_no_space(err):  # a bug or an unexpected OS error: still leave a verdict
            reason = f"{type(err).__name__}: {err}"
            raise
        reason = space.no_space_reason(plan.result_dir, err)
    except Exception as err:  # a bug or an unexpected OS error: still leave a verdict
        reason = f"{type(err).__name__}: {err}"
        raise
    finally:
        watchdog.dismiss()  # every child is stopped: nothing writes into result_dir after the verdict
        if status == "FAILED":
            if reason and not reason.startswith("no space left") and space.short_of_space(plan.result_dir):
                reason = space.no_space_reason(plan.result_dir, after=reason)  # what the run died of
            reasons = [reason or "unknown failure"]
        extra: dict[str, object] = {}
        if plan.router is not None:
            extra["scaleout"] = plan.scaleout_record()
        if stated:
            extra["engine_settings"] = {k: v.to_record() if v else None for k, v in stated.items()}
        extra.update(image_record(plan.cell.model_dump(), os.environ))
        status, reasons = _write_verdict(plan, versions, start_utc, status, reasons, extra)
        seal(plan.result_dir, plan.cell, versions.get("engine"), say)
        say(status + (f": {'; '.join(reasons)}" if reasons else ""))
    return status, "; ".join(reasons) or None


def _write_verdict(
    plan: CellPlan,
    versions: Mapping[str, str | None],
    start_utc: str,
    status: Verdict,
    reasons: list[str],
    extra: Mapping[str, Any],
) -> tuple[Verdict, list[str]]:
    """cell.json and status.txt; on a full disk the reserve and temporary files go first, and the
    verdict is FAILED with the reason. Returns what was written."""

    def write(status: Verdict, reasons: list[str]) -> None:
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
            extra=extra or None,
        )

    try:
        write(status, reasons)
    except OSError as err:
        if not space.is_no_space(err):
            raise
        space.release(plan.result_dir)
        if not (status == "FAILED" and reasons and reasons[0].startswith("no space left")):
            said = "; ".join(reasons) if status == "FAILED" else None  # what the run died of, if it did
            reasons = [space.no_space_reason(plan.result_dir, err, after=said)]
        status = "FAILED"
        write(status, reasons)
    finally:
        space.release(plan.result_dir)
    return status, reasons


def _figures_line(plan: CellPlan) -> str:
    """One line on what the cell measured, as collect's table will read it (contract.figures: its
    definitions, the engine's clock): throughput per GPU, TTFT and interactivity."""
    try:
        summary = load_summary(plan.result_dir)
        values = summary_figures(summary, gpus=plan.cell.gpus, speed=plan.cell.speed)
    except Exception as err:  # a line of progress never decides a cell's fate
        return f"figures not read: {type(err).__name__}: {err}"

    def num(key: str, spec: str) -> str:
        value = values.get(key)
        return format(value, spec) if isinstance(value, int | float) else "–"

    return (
        f"figures: {num('output_tok_per_s_per_gpu', ',.1f')} output tok/s per GPU "
        f"({num('total_tok_per_s_per_gpu', ',.0f')} total), TTFT p50 {num('ttft_p50_s', '.3g')} s "
        f"p90 {num('ttft_p90_s', '.3g')} s, interactivity p50 {num('interactivity_p50_tok_per_s', '.1f')} "
        "tok/s per user"
    )


def _power_line(plan: CellPlan) -> str:
    """One line on the cell's power: its energy and joules per output token, or why they are withheld
    (the verdict does not depend on it)."""
    try:
        power = cell_power_summary(plan.result_dir, plan.cell)
    except Exception as err:  # the power figures never decide a cell's fate, not even by a bug
        return f"power summary failed: {type(err).__name__}: {err}"
    if not power.power_valid:
        return f"power figures withheld: {'; '.join(power.reasons)}"
    per_token = power.joules_per_output_token
    return (
        f"power: {power.total_gpu_energy_j or 0:.0f} J over the window ({power.audit.energy_from}), "
        f"{power.avg_power_w or 0:.0f} W average for {power.audit.observed_gpus} GPUs"
        + (f", {per_token:.3g} J per output token" if per_token is not None else "")
    )


def seal(
    result_dir: Path, cell: Cell | Mapping[str, Any], engine_version: str | None, say: Callable[[str], None]
) -> None:
    """Write receipt.json over the finished result directory: the last file a cell writes, after its
    verdict, whatever the verdict. The recipe fingerprint covers the cell as cell.json records it
    (secrets masked: two runs differing only in a token share a recipe). A receipt that cannot be
    written (a full disk) is said, not raised: the verdict stands, and the directory reads as one
    that never finished (no receipt)."""
    if isinstance(cell, Cell):
        fields = record.mask_cell(cell.model_dump(mode="json"))
        client_version = client(cell.client).version()
    else:
        fields, client_version = record.mask_cell(cell), None
    try:
        write_receipt(result_dir, fields, engine_version=engine_version, client_version=client_version)
    except OSError as err:
        say(f"could not write {RECEIPT_JSON}: {err.strerror or err}")


def cached_metrics_file(plan: CellPlan) -> str:
    """The scrapes the client's cached tokens are checked against (see validity.checks.evaluate)."""
    if (
        plan.router is not None
        and plan.mode == "pd"
        and router_recipe(plan.router.program).pd_cached_tokens_from == "prefill"
    ):
        return PREFILL_METRICS_CSV
    return SERVER_METRICS_CSV


def settings_check(plan: CellPlan, stated: dict[str, Stated | None]) -> Check:
    """``engine_settings``: every instance runs with the settings the cell's label says, as far as its
    start-up log states them (not judged where it states none)."""
    problems: list[str] = []
    checked = 0
    for inst, (_role, _i, tp) in zip(plan.instances, instance_shapes(plan.cell), strict=False):
        found = stated.get(inst.name or "engine")
        if found is None:
            continue
        checked += 1
        who = inst.label if not inst.name else f"{inst.label} ({inst.name})"
        problems += mismatches(expected_settings(plan.cell, tp, inst.port), found, who)
    if problems:
        return Check(float(len(problems)), 0.0, False, "; ".join(problems))
    if not checked:
        return Check(None, 0.0, True, note="not judged: no engine instance stated its settings")
    return Check(0.0, 0.0, True)


def judge(plan: CellPlan, stated: dict[str, Stated | None] | None = None) -> list[str]:
    """Run the validity checks, record them in summary.json, and return the failed checks' reasons."""
    validity = evaluate(plan.result_dir, plan.cell, cached_metrics_file(plan))
    validity.checks["engine_settings"] = settings_check(plan, stated or {})
    accuracy, block = accuracy_check(plan.cell, plan.result_dir)
    if accuracy is not None:
        validity.checks["accuracy"] = accuracy
    summary = load_summary(plan.result_dir, required=("counts",))
    summary["validity"] = validity.to_dict()
    if block is not None:
        summary["accuracy"] = block
    try:
        write_summary(plan.result_dir, summary)
    except OSError as err:  # name the file (a failed write() names none)
        raise OSError(err.errno, err.strerror, str(plan.result_dir / SUMMARY_JSON)) from err
    return validity.reasons


def check_outputs(result_dir: Path) -> str | None:
    """Why the replayer's files cannot be judged (missing, broken, nothing sent), or None."""
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


def kv_cache_tester_version() -> str | None:
    try:
        import kv_cache_tester
    except ImportError:
        return None
    return str(getattr(kv_cache_tester, "__version__", None))
