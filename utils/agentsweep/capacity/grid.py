"""The capacity read off an ordinary sweep: per series of cells (one engine, offload mode, router,
shape and TP at one or more user counts), each tier's boundary from the grid of user counts.

The cells are judged as the search judges its steps (valid, every constraint holding on the
statistic smoothed over users). Between the largest passing count and the smallest failing one the
boundary is interpolated on the binding constraint's statistic (linear in users, rounded down), and
marked so: a grid of 2, 4, 8 users that passes at 4 and fails at 8 reads, say, "6 (interpolated
4-7)". Adjacent counts need no interpolation; a binding validity failure is not interpolated (the
boundary is then the last passing count). A series of one count says only "at least" that many (it
meets the tier) or "none" (even that count misses it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agentsweep.capacity.lines import agents
from agentsweep.capacity.search import VALIDITY, Binding, Point, Run, binding_at, bracket, pass_map, points_of
from agentsweep.contract.slo import SloConstraint, SloTier

GridKind = Literal["exact", "interpolated", "bracketed", "none", "at_least"]


@dataclass(frozen=True)
class GridRun:
    """One ordinary cell of the grid as a run at its user count."""

    users: int
    status: str
    statistics: dict[str, float | None]
    reasons: tuple[str, ...] = ()
    output_tok_per_s_per_gpu: float | None = None
    total_tok_per_s_per_gpu: float | None = None
    kv_working_set_tokens: int | None = None
    kv_pool_tokens: int | None = None

    @property
    def valid(self) -> bool:
        return self.status == "SUCCESS"


@dataclass(frozen=True)
class GridCapacity:
    """One tier's capacity from a grid of cells."""

    tier: SloTier
    kind: GridKind
    boundary_users: float  # interpolated boundaries are rounded down to whole users
    passing: int | None
    failing: int | None
    binding: str | None
    binding_value: float | None
    binding_users: int | None
    output_tok_per_s_per_gpu: float | None
    total_tok_per_s_per_gpu: float | None
    binding_text: str = ""  # the binding value as its constraint writes it (or the cell's first reason)

    def line(self, series: str, gpus: int) -> str:
        """The tier's plain line for a series, marked as read off the grid."""
        head = f"tier {self.tier.describe()}, {series} (grid): "
        if self.kind == "none":
            return f"{head}0 agents per GPU: even {self.failing} users miss it (bound by {self.binding})"
        if self.kind == "at_least":
            return f"{head}≥ {agents(self.boundary_users, gpus)} agents per GPU (the largest cell meets it)"
        assert self.passing is not None and self.failing is not None
        between = f"{agents(self.passing, gpus)}–{agents(self.failing - 1, gpus)}"
        how = {"exact": "", "interpolated": "interpolated ", "bracketed": "between cells "}[self.kind]
        return f"{head}{agents(self.boundary_users, gpus)} agents per GPU ({how}{between}), bound by {self.binding}"


def _interpolate(constraint: SloConstraint, below: Point, above: Point) -> float | None:
    """Where the constraint's statistic crosses its threshold between two counts (linear), or None."""
    lo, hi = below.raw(constraint.key), above.raw(constraint.key)
    if lo is None or hi is None or lo == hi:
        return None
    share = (constraint.threshold - lo) / (hi - lo)
    if not 0.0 <= share <= 1.0:
        return None
    return below.users + share * (above.users - below.users)


def grid_capacity(tier: SloTier, runs: Sequence[Run]) -> GridCapacity | None:
    """The tier's capacity from the runs (None without any)."""
    points = points_of(runs)
    if not points:
        return None
    passing, failing = bracket(pass_map(tier, points))
    binding: Binding | None = None
    if failing is not None:
        binding = binding_at(tier, points, failing)
    if failing is None:
        kind: GridKind = "at_least"
        boundary = float(points[-1].users)
    elif passing is None:
        kind, boundary = "none", 0.0
    elif failing - passing == 1:
        kind, boundary = "exact", float(passing)
    else:
        kind, boundary = "bracketed", float(passing)
        assert binding is not None
        constraint = next((c for c in tier.constraints if c.statistic_label == binding.label), None)
        if binding.label != VALIDITY and constraint is not None:
            below = next(p for p in points if p.users == passing)
            above = next(p for p in points if p.users == failing)
            crossing = _interpolate(constraint, below, above)
            if crossing is not None:
                kind = "interpolated"
                boundary = float(min(failing - 1, max(passing, math.floor(crossing))))
    at = next((p for p in points if p.users == passing), None) if kind != "none" else None
    return GridCapacity(
        tier=tier,
        kind=kind,
        boundary_users=boundary,
        passing=passing,
        failing=failing,
        binding=binding.label if binding else None,
        binding_value=binding.value if binding else None,
        binding_users=failing if binding else None,
        output_tok_per_s_per_gpu=at.mean_of(lambda r: r.output_tok_per_s_per_gpu) if at else None,
        total_tok_per_s_per_gpu=at.mean_of(lambda r: r.total_tok_per_s_per_gpu) if at else None,
        binding_text=binding.text if binding else "",
    )
