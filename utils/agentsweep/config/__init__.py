"""Sweep configs and the matrix of cells.

Python API (every error is an ``agentsweep.errors.ConfigError`` or ``InputError``: one line, exit 2):

- ``load_runners(path=None) -> dict[str, RunnerSpec]``: configs/runners.yaml (default:
  ``$AGENTSWEEP_RUNNERS``, else configs/runners.yaml under the repo root).
- ``load_sweep(path, key) -> SweepSpec``: one validated config key (``path=None``: the default
  configs/agentic.yaml, found in the current directory, then in the repo root).
- ``expand(spec, runners, *, tp=None, users=None, offload=None, max_tp=None, duration=None)
  -> list[Cell]``: the entry's cells, deduped, in config order, after the filters.
- ``select_cells(config_path, keys, tp=None, users=None, offload=None, max_tp=None, duration=None,
  *, runners=None, max_cells=256) -> list[Cell]``: glob keys, expand, filter, and refuse what GitHub
  would refuse; the one entry ``agentsweep matrix`` and the local sweep share (``max_cells=None``
  lifts the 256-cell limit for local runs).
The cell itself, ``Cell``, is the shared contract of :mod:`agentsweep.contract`.
"""

from agentsweep.config.loader import load_runners, load_sweep
from agentsweep.config.matrix import (
    MAX_MATRIX_CELLS,
    exp_name,
    expand,
    offload_budget_gb,
    select_cells,
)
from agentsweep.config.schema import RunnerSpec, SearchPoint, SweepSpec

__all__ = [
    "MAX_MATRIX_CELLS",
    "RunnerSpec",
    "SearchPoint",
    "SweepSpec",
    "exp_name",
    "expand",
    "load_runners",
    "load_sweep",
    "offload_budget_gb",
    "select_cells",
]
