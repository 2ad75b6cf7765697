"""How many measured steps a capacity cell's job time limit holds, planned before anything starts.

Below the allocation and the matrix alike (it needs only the cell and its engine recipe's margins), so
that the matrix can refuse a capacity cell whose time limit holds no step, and the allocation and
the cell can budget the ones that do.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from agentsweep.cell.engines import recipe
from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError

# Seconds added to the replay duration for the allocation's time limit: the engine recipe's start-up
# margin (pulling or importing the image, loading weights, compiling/capturing graphs, the warmup
# requests) and this drain margin (in-flight requests finishing, stopping the engine, writing results).
DRAIN_MARGIN_S = 300


def env_int(env: Mapping[str, str], name: str, *, minimum: int, default: int | None = None) -> int:
    """A whole-number setting of the cell's environment, at least ``minimum``; InputError names it."""
    raw = env.get(name, "").strip()
    if not raw:
        if default is None:
            raise InputError(f"cell env {name} is not set (the launcher needs it)")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"cell env {name}={raw!r}: not an integer") from None
    if value < minimum:
        raise InputError(f"cell env {name}={raw!r}: must be >= {minimum}")
    return value


@dataclass(frozen=True)
class StepBudget:
    """How many measured steps a capacity cell's job time limit holds, as planned before it starts.

    The start-up and drain margins (as for any cell's allocation) come off the time limit; each step is
    reckoned at its replay duration plus the engine's step overhead. The cell also checks, before every
    step, that the next one fits the time left by the longest step it has seen (``fits``).
    """

    time_limit_s: int
    startup_s: int
    drain_s: int
    step_s: float
    steps: int

    def fits(self, elapsed_s: float, next_step_s: float) -> bool:
        """Whether a step of ``next_step_s`` started ``elapsed_s`` after the cell began ends in time."""
        return elapsed_s + max(next_step_s, self.step_s) <= self.time_limit_s - self.drain_s

    def describe(self) -> str:
        return (
            f"step budget {self.steps} steps of about {self.step_s:.0f} s within the job's "
            f"{self.time_limit_s / 60:g} min time limit (start-up {self.startup_s} s and drain "
            f"{self.drain_s} s kept aside)"
        )


def step_budget(cell: Cell, env: Mapping[str, str] = os.environ) -> StepBudget:
    """The step budget of a capacity cell (its ``capacity`` must be set)."""
    assert cell.capacity is not None, "only a capacity cell has a step budget"
    engine = recipe(cell.engine)
    startup = env_int(env, "AGENTSWEEP_STARTUP_MARGIN_S", minimum=0, default=engine.startup_margin_s)
    startup += math.ceil(cell.accuracy.reserved_s(cell.simulated))  # the gate, before the first step
    drain = env_int(env, "AGENTSWEEP_DRAIN_MARGIN_S", minimum=0, default=DRAIN_MARGIN_S)
    limit = cell.capacity.time_limit_min * 60
    step_s = cell.duration + engine.step_overhead_s
    steps = max(0, math.floor((limit - startup - drain) / step_s))
    return StepBudget(time_limit_s=limit, startup_s=startup, drain_s=drain, step_s=step_s, steps=steps)


def no_step_reason(cell: Cell, env: Mapping[str, str] = os.environ) -> str | None:
    """Why a capacity cell's job time limit holds no search step (it would start its engine and measure
    nothing), or None when it holds at least one."""
    budget = step_budget(cell, env)
    if budget.steps > 0:
        return None
    need = math.ceil((budget.startup_s + budget.drain_s + budget.step_s) / 60)
    return (
        f"a time limit of {budget.time_limit_s / 60:g} min holds no search step: each takes about "
        f"{budget.step_s:.0f} s after {budget.startup_s} s start-up, and {budget.drain_s} s drain stay "
        f"aside; give it at least {need} min"
    )
