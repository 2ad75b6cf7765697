"""Agents per MW: the hook where a step's power figures come in.

The energy measurement (``power.csv`` of the cell's GPUs and its summary, declared in
``agentsweep.contract.resultdir.files`` by that part) is not part of the result directory yet. Until
it is, ``step_power_w`` finds no figure and every tier's ``agents_per_mw`` stays empty; once a step
directory holds power figures, this function returns their mean over the step and the capacity line
adds agents per MW (boundary users / (the cell's mean GPU power in MW)).
"""

from __future__ import annotations

from pathlib import Path


def step_power_w(step_dir: Path) -> float | None:
    """The mean power (W) of all the cell's GPUs over a step's measurement; None where not measured."""
    del step_dir  # no result file holds power figures yet (see the module docstring)
    return None
