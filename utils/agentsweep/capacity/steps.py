"""A capacity cell's steps (result directories of their own): the cell each runs, its capacity.json record."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentsweep.capacity.measure import run_figures
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import StepRecord, step_dir
from agentsweep.contract.slo import CapacitySpec
from agentsweep.contract.verdict import Verdict


def step_cell(cell: Cell, index: int, users: int) -> Cell:
    """The ordinary cell a step runs: the capacity cell at ``users``, named after the step."""
    return cell.replace(users=users, capacity=None, exp_name=f"{cell.exp_name}-step{index}-u{users}")


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
