"""The Slurm allocation a cell needs: its time limit and host memory (the launchers' helper,
`python -m agentsweep.commands.allocation`, prints them with the runner's site settings)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from agentsweep.cell.engines import recipe
from agentsweep.cell.step_budget import DRAIN_MARGIN_S, env_int
from agentsweep.contract.cell import Cell

# Host memory asked for on top of the offload budget (engine process, weights staging, the client).
MEM_OVERHEAD_GB = 32


def time_limit_min(duration_s: int, engine: str, env: Mapping[str, str], default_min: int) -> int:
    """Allocation time limit in whole minutes: replay duration + start-up + drain margins.

    A cell without a duration gets the runner's default `time_limit_min`.
    """
    if duration_s <= 0:
        return default_min
    startup = env_int(env, "AGENTSWEEP_STARTUP_MARGIN_S", minimum=0, default=recipe(engine).startup_margin_s)
    drain = env_int(env, "AGENTSWEEP_DRAIN_MARGIN_S", minimum=0, default=DRAIN_MARGIN_S)
    return max(1, math.ceil((duration_s + startup + drain) / 60))


def cell_time_limit_min(cell: Cell, env: Mapping[str, str], default_min: int) -> int:
    """The allocation time limit of ``cell``: a capacity cell's is its job time limit (the steps are
    budgeted to fit it); any other cell's follows its duration (``time_limit_min``) and the accuracy
    gate's budget when the gate runs."""
    if cell.capacity is not None:
        return cell.capacity.time_limit_min
    gate = math.ceil(cell.accuracy.reserved_s(cell.simulated))
    return time_limit_min(cell.duration + gate, cell.engine, env, default_min)


def mem_gb(cpu_dram_gb: float, env: Mapping[str, str]) -> int:
    """Host memory to ask Slurm for (GiB); 0 = leave it to the cluster's default (no offload)."""
    if cpu_dram_gb <= 0:
        return 0
    overhead = env_int(env, "AGENTSWEEP_MEM_OVERHEAD_GB", minimum=0, default=MEM_OVERHEAD_GB)
    return math.ceil(cpu_dram_gb) + overhead
