"""The accuracy gate as a step of a cell: after its engine group is healthy, before the first replay
(docs/accuracy.md). Its requests go to the engine (or the router) before any metrics collector starts,
so they are in neither the records nor the server-metrics window; its outcome is accuracy.json, and
``accuracy_check`` turns it into the cell's ``accuracy`` check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kv_cache_tester.replay.results import Accuracy

from agentsweep.accuracy.harness import (
    HarnessFailed,
    harness_executable,
    missing_question_files,
    run_harness,
    write_answers,
)
from agentsweep.contract.accuracy import NOT_MEASURED
from agentsweep.contract.cell import Cell
from agentsweep.contract.model_keys import model_prefix
from agentsweep.contract.resultdir.accuracy import AccuracyRecord, read_accuracy, write_accuracy
from agentsweep.contract.verdict import Check
from agentsweep.errors import InputError, ResultFileError


def threshold(cell: Cell) -> tuple[float, str]:
    """The score the cell's engine must reach, and where that number comes from."""
    return cell.accuracy.threshold_for(model_prefix(cell.model, cell.infmax_model_prefix))


def check_ready(cell: Cell) -> None:
    """Before any engine starts: the harness is installed and the local questions exist (InputError)."""
    spec = cell.accuracy
    if not spec.applies(cell.simulated):
        return
    harness_executable()
    if not spec.data:
        return
    if not Path(spec.data).is_dir():
        raise InputError(f"cell {cell.exp_name}: accuracy.data {spec.data}: not a directory")
    missing = missing_question_files(Path(spec.data))
    if missing:
        raise InputError(f"cell {cell.exp_name}: accuracy.data {spec.data}: no {', '.join(missing)}")


def describe(cell: Cell) -> str:
    """The dry run's line: whether the gate runs, its task, questions, threshold and time estimate."""
    spec = cell.accuracy
    if spec.run == "off":
        return "accuracy: off"
    if not spec.applies(cell.simulated):
        return f"accuracy: not run, {NOT_MEASURED} (accuracy: on forces it)"
    value, source = threshold(cell)
    questions = f"{spec.limit} questions (seed {spec.seed})" if spec.limit else "every question"
    where = f"questions from {spec.data}" if spec.data else "questions from the Hugging Face cache"
    return (
        f"accuracy: {spec.task} {spec.effective_fewshot}-shot, {questions}, threshold {value:.2f} "
        f"({source}); about {spec.estimate_s():.0f} s, at most {spec.timeout_s:g} s; {where}"
    )


def run_accuracy_step(cell: Cell, base_url: str, result_dir: Path, say: Callable[[str], None]) -> None:
    """Score the cell's engine at ``base_url`` and write accuracy.json (and accuracy.jsonl); a step
    that cannot run leaves an ``error`` record (the cell is judged INVALID on it), never raises."""
    spec = cell.accuracy
    if not spec.applies(cell.simulated):
        if spec.run == "auto":
            say(NOT_MEASURED)
        return
    value, source = threshold(cell)
    say(describe(cell))
    try:
        run = run_harness(
            spec,
            base_url,
            cell.model,
            data=Path(spec.data) if spec.data else None,
            threshold=(value, source),
        )
    except (HarnessFailed, InputError) as err:  # InputError: the harness or its task file gone since
        write_accuracy(
            result_dir,
            AccuracyRecord(
                outcome="error",
                task=spec.task,
                reason=str(err).removeprefix("accuracy: "),
                threshold=value,
                threshold_source=source,
            ),
        )
        say(f"{err}; the cell will be INVALID")
        return
    write_answers(run, result_dir)
    say(f"accuracy: {run.score.line()} ({run.seconds:.0f} s)")


def accuracy_check(cell: Cell, result_dir: Path) -> tuple[Check | None, Accuracy | None]:
    """The cell's ``accuracy`` check and summary.json's ``accuracy`` block (None, None: the gate is off;
    no check, only the block, for a simulated engine's cell: it is not judged on it).

    A cell whose gate should have run and left no accuracy.json fails the check: a score that was
    never taken cannot pass."""
    spec = cell.accuracy
    if spec.run == "off":
        return None, None
    if not spec.applies(cell.simulated):
        return None, {"outcome": "not measured", "task": spec.task, "reason": NOT_MEASURED}
    try:
        record = read_accuracy(result_dir)
    except ResultFileError as err:
        return Check(None, None, False, str(err)), {"outcome": "error", "task": spec.task, "reason": str(err)}
    if record is None:
        value, _ = threshold(cell)
        reason = f"{spec.task}: the accuracy step left no accuracy.json"
        return Check(None, value, False, reason), {"outcome": "error", "task": spec.task, "reason": reason}
    block = record.summary_block()
    return Check(record.score, record.threshold, record.outcome == "passed", record.reason), block
