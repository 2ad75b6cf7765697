"""A capacity cell's steps as result directories: the cell each runs, its record in capacity.json, and
which of them an interrupted search's ``--resume`` keeps.

A step stands (is kept on resume, not measured again) when it is a finished, judged measurement of
this very search: ``steps/<n>/`` is a directory (not a link), numbered from 0 without a gap, that
matches its own receipt (``agentsweep verify``), whose verdict is SUCCESS or INVALID (a FAILED step,
one cut short by an interrupt say, measured nothing), whose cell is the capacity cell at its count,
and whose count is the one the search picks after the steps before it (``next_step``): so the search
goes on exactly as it would have. The first step that does not stand, and every one after it, runs
again. Its statistics are read again from its own files (``run_figures``), never from the old
capacity.json.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from agentsweep.capacity.measure import run_figures
from agentsweep.capacity.search import next_step
from agentsweep.cell.record import mask_cell
from agentsweep.contract.cell import Cell
from agentsweep.contract.receipt import ReceiptError, verify
from agentsweep.contract.resultdir import STEPS_DIR, StepRecord, read_cell_record, read_status, step_dir
from agentsweep.contract.slo import CapacitySpec
from agentsweep.contract.verdict import Verdict
from agentsweep.errors import InputError


def step_cell(cell: Cell, index: int, users: int) -> Cell:
    """The ordinary cell a step runs: the capacity cell at ``users``, named after the step. Its accuracy
    gate is the capacity cell's, run once per engine start before the first step (not per step)."""
    return cell.replace(
        users=users,
        capacity=None,
        exp_name=f"{cell.exp_name}-step{index}-u{users}",
        accuracy={**cell.accuracy.model_dump(), "run": "off"},
    )


def step_record(
    result_dir: Path,
    spec: CapacitySpec,
    cell: Cell,
    *,
    index: int,
    repeat: int,
    status: Verdict,
    reasons: Sequence[str],
    wall_s: float,
    start_utc: str | None,
    end_utc: str | None,
) -> StepRecord:
    """capacity.json's record of step ``index`` (``cell``: the step's own cell), its statistics read
    from the step's files."""
    sdir = step_dir(result_dir, index)
    figures = run_figures(sdir, cell, spec.constraints)
    return StepRecord(
        index=index,
        users=cell.users,
        repeat=repeat,
        dir=sdir.relative_to(result_dir).as_posix(),
        exp_name=cell.exp_name,
        status=status,
        reasons=tuple(" ".join(r.split()) for r in reasons),
        statistics=figures.statistics,
        output_tok_per_s_per_gpu=figures.output_tok_per_s_per_gpu,
        total_tok_per_s_per_gpu=figures.total_tok_per_s_per_gpu,
        kv_working_set_tokens=figures.kv_working_set_tokens,
        kv_pool_tokens=figures.kv_pool_tokens,
        wall_s=round(max(0.0, wall_s), 3),
        start_utc=start_utc,
        end_utc=end_utc,
    )


def _seconds(start: str | None, end: str | None) -> float:
    if not start or not end:
        return 0.0
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return 0.0


def _standing(cell: Cell, result_dir: Path, index: int, kept: list[StepRecord]) -> StepRecord | str:
    """Step ``index`` as its record when it stands after ``kept``, else why it does not."""
    spec = cell.capacity
    assert spec is not None
    sdir = step_dir(result_dir, index)
    where = f"{STEPS_DIR}/{index}"
    if sdir.is_symlink() or not sdir.is_dir():
        return f"{where}: not a directory"
    try:
        problems = verify(sdir)
        record = read_cell_record(sdir)
        status = read_status(sdir)
    except (ReceiptError, InputError) as err:
        return f"{where}: {str(err).replace(f'{sdir}/', '', 1)}"
    except OSError as err:
        return f"{where}: unreadable ({err.strerror or err})"
    if problems:
        return f"{where}: does not match its receipt ({problems[0].path}: {problems[0].kind})"
    if record is None or status is None:
        return f"{where}: no verdict"
    if status.verdict != record.status:
        return f"{where}: status.txt says {status.verdict}, cell.json {record.status}"
    if record.status == "FAILED":
        return f"{where}: FAILED ({status.reason or 'no reason given'}): it measured nothing"
    users = record.cell.get("users")
    expected = next_step(spec, kept)
    if expected is None or users != expected[0]:
        want = "no further step" if expected is None else f"{expected[0]} users"
        return f"{where}: ran {users} users where the search now takes {want}"
    ran = step_cell(cell, index, expected[0])
    if record.cell != mask_cell(ran.model_dump(mode="json")):
        return f"{where}: ran another cell than this search's step at {users} users"
    return step_record(
        result_dir,
        spec,
        ran,
        index=index,
        repeat=expected[1],
        status=record.status,
        reasons=status.reasons,
        wall_s=_seconds(record.start_utc, record.end_utc),
        start_utc=record.start_utc,
        end_utc=record.end_utc,
    )


def measured_steps(cell: Cell, result_dir: Path) -> tuple[list[StepRecord], str | None]:
    """The leading steps of ``result_dir`` that stand (module docstring), and why the next one present
    does not (None when every step present stands)."""
    kept: list[StepRecord] = []
    while step_dir(result_dir, len(kept)).exists() or step_dir(result_dir, len(kept)).is_symlink():
        found = _standing(cell, result_dir, len(kept), kept)
        if isinstance(found, str):
            return kept, found
        kept.append(found)
    return kept, None


def leftovers(result_dir: Path, kept: int) -> list[str]:
    """What ``steps/`` holds besides steps 0..kept-1 (names, sorted)."""
    folder = result_dir / STEPS_DIR
    if not folder.is_dir() or folder.is_symlink():
        return [STEPS_DIR] if folder.exists() or folder.is_symlink() else []
    keep = {str(i) for i in range(kept)}
    return sorted(f"{STEPS_DIR}/{p.name}" for p in folder.iterdir() if p.name not in keep)


def keep_measured(cell: Cell, result_dir: Path) -> list[str]:
    """Make an interrupted capacity cell's result directory one its search resumes from: the steps that
    stand stay, everything else goes (its verdict, capacity.json, receipt, logs, the steps that run
    again). Returns what to say; with no step standing the directory is removed."""
    kept, why = measured_steps(cell, result_dir)
    lines = []
    if kept:
        counts = ", ".join(str(s.users) for s in kept)
        lines.append(f"--resume keeps {len(kept)} measured step(s) (users {counts})")
    if why:
        lines.append(f"measured again from {why}")
    if not kept:
        shutil.rmtree(result_dir)
        return lines
    keep = {step_dir(result_dir, s.index) for s in kept}
    for path in sorted(result_dir.iterdir()):
        if path.name == STEPS_DIR and not path.is_symlink() and path.is_dir():
            for step in sorted(path.iterdir()):
                if step not in keep:
                    _remove(step)
        else:
            _remove(path)
    return lines


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
