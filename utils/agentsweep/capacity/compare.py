"""A capacity search against an independent grid of ordinary cells at every user count of its range:
does each tier's boundary agree, and which spent fewer engine-seconds? (scripts/capacity_acceptance.py)

A tier agrees when the grid's boundary lies within the search's interval widened by its resolution
(one user at whole-user resolution, else the relative resolution of the boundary), or when both say
capacity 0, or both say at least the top of the range. Engine-seconds are the engines' wall-clock
up-time, taken alike for both from cell.json's start and end (the capacity cell: one engine start
for all its steps; each grid cell: one of its own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from agentsweep.capacity.grid import GridCapacity, GridRun, grid_capacity
from agentsweep.capacity.measure import run_figures
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import CapacityRecord, TierResult, read_capacity, read_cell_record
from agentsweep.contract.slo import CapacitySpec
from agentsweep.errors import InputError


@dataclass(frozen=True)
class TierComparison:
    tier: str
    search: TierResult
    grid: GridCapacity | None
    agrees: bool
    why: str


@dataclass(frozen=True)
class Comparison:
    tiers: list[TierComparison]
    search_engine_s: float
    grid_engine_s: float
    search_steps: int
    grid_cells: int

    @property
    def agrees(self) -> bool:
        return all(t.agrees for t in self.tiers)

    @property
    def cheaper(self) -> bool:
        return self.search_engine_s < self.grid_engine_s


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _seconds(start: str | None, end: str | None) -> float:
    if not start or not end:
        return 0.0
    return max(0.0, (_utc(end) - _utc(start)).total_seconds())


def _cell(path: Path) -> tuple[Cell, str, float]:
    record = read_cell_record(path)
    if record is None:
        raise InputError(f"{path}: no cell.json")
    return record.parse_cell(), record.status, _seconds(record.start_utc, record.end_utc)


def grid_runs(grid_dirs: Sequence[Path], spec: CapacitySpec) -> tuple[list[GridRun], float]:
    """The grid cells as runs (statistics of the search's constraints), and their engine-seconds."""
    runs: list[GridRun] = []
    seconds = 0.0
    for path in grid_dirs:
        cell, status, wall = _cell(path)
        seconds += wall
        figures = run_figures(path, cell, spec.constraints)
        runs.append(
            GridRun(
                users=cell.users,
                status=status,
                statistics=figures.statistics,
                output_tok_per_s_per_gpu=figures.output_tok_per_s_per_gpu,
                total_tok_per_s_per_gpu=figures.total_tok_per_s_per_gpu,
                kv_working_set_tokens=figures.kv_working_set_tokens,
                kv_pool_tokens=figures.kv_pool_tokens,
            )
        )
    return runs, seconds


def _agree(spec: CapacitySpec, search: TierResult, grid: GridCapacity | None) -> tuple[bool, str]:
    if grid is None:
        return False, "the grid has no cell"
    if search.boundary_type == "none" or grid.kind == "none":
        same = search.boundary_type == "none" and grid.kind == "none"
        return same, "both: even the lowest count misses the tier" if same else "only one says capacity 0"
    if search.boundary_type == "at_least" or grid.kind == "at_least":
        same = search.boundary_type == "at_least" and grid.kind == "at_least"
        return same, "both: the highest count meets the tier" if same else "only one says >= high"
    if search.boundary_users is None or search.interval_users is None:
        return False, f"the search did not bracket it ({search.stop_reason})"
    low, high = search.interval_users
    top = high if high is not None else spec.high
    slack = max(1, math.floor(spec.resolution * search.boundary_users))
    inside = low - slack <= grid.boundary_users <= top + slack
    return inside, (
        f"grid {grid.boundary_users:g} {'within' if inside else 'outside'} the search's interval "
        f"{low}–{top} ± {slack} (resolution)"
    )


def compare(search_dir: Path, grid_dirs: Sequence[Path]) -> Comparison:
    """The search cell at ``search_dir`` against the grid cells at ``grid_dirs``."""
    cell, _status, search_seconds = _cell(search_dir)
    spec = cell.capacity
    if spec is None:
        raise InputError(f"{search_dir}: not a capacity cell")
    record: CapacityRecord | None = read_capacity(search_dir)
    if record is None:
        raise InputError(f"{search_dir}: no capacity.json")
    runs, grid_seconds = grid_runs(grid_dirs, spec)
    tiers = []
    for tier, result in zip(spec.tiers, record.tiers, strict=True):
        grid = grid_capacity(tier, runs)
        agrees, why = _agree(spec, result, grid)
        tiers.append(TierComparison(tier.name, result, grid, agrees, why))
    return Comparison(tiers, search_seconds, grid_seconds, len(record.steps), len(runs))
