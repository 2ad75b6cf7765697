"""Agents per MW: a step's power from its own power.csv and summary (the energy part's power summary).

Each step of a capacity cell samples the cell's GPUs into ``steps/<n>/power.csv`` (the plan of a step
carries the cell's power sampler); the step's mean power over its measurement window, every GPU of the
cell summed, turns the boundary into agents per MW (boundary users / mean power in MW). A step whose
power figures are withheld (``power_valid`` false: no source, gaps, missing GPUs) gives none.
"""

from __future__ import annotations

from pathlib import Path

from agentsweep.contract.cell import Cell
from agentsweep.energy.summary import cell_power_summary


def step_power_w(step_dir: Path, cell: Cell) -> float | None:
    """The mean power (W) of all the cell's GPUs over a step's measurement; None where not measured."""
    summary = cell_power_summary(step_dir, cell)
    if not summary.power_valid or summary.avg_power_w is None:
        return None
    return summary.avg_power_w
