"""The capacity search over user counts: which count to measure next, and what the steps say per tier.

Every tier comes from the same steps. A count meets a tier when each of its steps is valid (SUCCESS)
and every constraint holds on the statistic smoothed over the counts (``isotonic``). A tier's
boundary is the largest count meeting it below the smallest count that misses it.

The search brackets from the low end (low, 2 low, 4 low, ... up to high) until some count misses a
tier, then bisects the bracket to whole users (or to the configured relative resolution). While some
tier has not failed yet the bracket goes on; then the next count is the lowest one an unresolved
tier's bisection needs. A tier is resolved when its bracket is
narrow enough, when the lowest count already misses it (capacity 0) or when the highest count still
meets it (capacity >= high). With several steps per count (``repeats``) the boundary's interval is a
bootstrap over the steps (seeded, so the same steps give the same interval).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from kv_cache_tester.stats import percentile

from agentsweep.capacity.isotonic import monotone
from agentsweep.capacity.lines import tier_line
from agentsweep.contract.resultdir.capacity import (
    BoundaryType,
    CliffRecord,
    StepRecord,
    StopReason,
    TierResult,
)
from agentsweep.contract.slo import CapacitySpec, SloConstraint, SloTier

BOOTSTRAP_REPLICATES = 400
BOOTSTRAP_SEED = 0
VALIDITY = "validity"  # the binding "constraint" when the count above the boundary was not a valid run

Kind = Literal["open", "bracketed", "none", "at_least"]


class Run(Protocol):
    """One measured run at one user count: a search step (``StepRecord``) or a grid cell."""

    @property
    def users(self) -> int: ...
    @property
    def valid(self) -> bool: ...
    @property
    def status(self) -> str: ...
    @property
    def reasons(self) -> tuple[str, ...]: ...
    @property
    def statistics(self) -> dict[str, float | None]: ...
    @property
    def output_tok_per_s_per_gpu(self) -> float | None: ...
    @property
    def total_tok_per_s_per_gpu(self) -> float | None: ...
    @property
    def kv_working_set_tokens(self) -> int | None: ...
    @property
    def kv_pool_tokens(self) -> int | None: ...


@dataclass
class Point:
    """The runs measured at one user count."""

    users: int
    steps: list[Run] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return bool(self.steps) and all(s.valid for s in self.steps)

    def samples(self, key: str) -> list[float]:
        """The statistic ``key`` of every valid step that measured it."""
        return [v for s in self.steps if s.valid and (v := s.statistics.get(key)) is not None]

    def raw(self, key: str) -> float | None:
        """The mean of those samples (unsmoothed), None without any."""
        values = self.samples(key)
        return math.fsum(values) / len(values) if values else None

    def mean_of(self, pick: Callable[[Run], float | int | None]) -> float | None:
        values = [float(v) for s in self.steps if (v := pick(s)) is not None]
        return math.fsum(values) / len(values) if values else None

    def first_reason(self) -> str:
        for step in self.steps:
            if not step.valid:
                return f"{step.status}: {step.reasons[0]}" if step.reasons else step.status
        return ""


def points_of(steps: Sequence[Run]) -> list[Point]:
    """The runs grouped by user count, lowest first."""
    by_users: dict[int, Point] = {}
    for step in steps:
        by_users.setdefault(step.users, Point(step.users)).steps.append(step)
    return [by_users[u] for u in sorted(by_users)]


def smoothed(constraint: SloConstraint, points: Sequence[Point]) -> dict[int, float]:
    """The constraint's statistic at each count that measured it, made monotone over the counts
    (worse with more users), each count weighted by its samples."""
    measured = [(p.users, p.samples(constraint.key)) for p in points]
    measured = [(u, s) for u, s in measured if s]
    if not measured:
        return {}
    fitted = monotone(
        [math.fsum(s) / len(s) for _u, s in measured],
        [float(len(s)) for _u, s in measured],
        increasing=not constraint.figure.higher_is_better,
    )
    return {u: value for (u, _s), value in zip(measured, fitted, strict=True)}


def pass_map(tier: SloTier, points: Sequence[Point]) -> dict[int, bool]:
    """Whether each measured count meets ``tier`` (valid steps, every smoothed constraint holding)."""
    ok = {p.users: p.valid for p in points}
    for constraint in tier.constraints:
        fit = smoothed(constraint, points)
        for p in points:
            value = fit.get(p.users)
            if value is None or not constraint.passes(value):
                ok[p.users] = False
    return ok


def bracket(passes: dict[int, bool]) -> tuple[int | None, int | None]:
    """(largest passing count below the first failing one, first failing count)."""
    failing = min((u for u, ok in passes.items() if not ok), default=None)
    passing = max((u for u, ok in passes.items() if ok and (failing is None or u < failing)), default=None)
    return passing, failing


@dataclass(frozen=True)
class TierState:
    """Where one tier stands after the steps so far."""

    tier: SloTier
    kind: Kind
    passing: int | None
    failing: int | None
    resolved: bool
    next_users: int | None


def tier_state(spec: CapacitySpec, tier: SloTier, points: Sequence[Point]) -> TierState:
    if not points:
        return TierState(tier, "open", None, None, False, spec.low)
    passing, failing = bracket(pass_map(tier, points))
    top = points[-1].users
    if failing is None:
        if top >= spec.high:
            return TierState(tier, "at_least", passing, None, True, None)
        return TierState(tier, "open", passing, None, False, min(spec.high, max(2 * top, top + 1)))
    if passing is None:
        if failing <= spec.low:
            return TierState(tier, "none", None, failing, True, None)
        return TierState(tier, "open", None, failing, False, spec.low)
    if spec.gap_resolved(passing, failing):
        return TierState(tier, "bracketed", passing, failing, True, None)
    return TierState(tier, "bracketed", passing, failing, False, (passing + failing) // 2)


def next_users(spec: CapacitySpec, steps: Sequence[StepRecord]) -> int | None:
    """The count to measure next, None when every tier is resolved: first the bracket's next count
    while some tier has not failed yet (what it finds up there can move the others' smoothed
    curves), then the lowest count some tier's bisection needs."""
    points = points_of(steps)
    unresolved = [s for t in spec.tiers if not (s := tier_state(spec, t, points)).resolved]
    opening = [s.next_users for s in unresolved if s.kind == "open" and s.next_users is not None]
    if opening:
        return max(opening)
    return min((s.next_users for s in unresolved if s.next_users is not None), default=None)


def next_step(spec: CapacitySpec, steps: Sequence[StepRecord]) -> tuple[int, int] | None:
    """(users, repeat) of the next step: the remaining runs of the last count (``repeats``), else the
    first run of ``next_users``; None when the search is done."""
    if steps:
        last = steps[-1].users
        done = sum(1 for s in steps if s.users == last)
        if done < spec.repeats:
            return last, done
    users = next_users(spec, steps)
    return None if users is None else (users, 0)


def _bootstrap_interval(
    spec: CapacitySpec, tier: SloTier, points: Sequence[Point]
) -> tuple[int, int | None] | None:
    """The 95 % bootstrap interval of the boundary: every count's steps resampled with replacement."""
    if all(len(p.steps) < 2 for p in points):
        return None
    rng = random.Random(f"{BOOTSTRAP_SEED}:{tier.name}")
    lows: list[float] = []
    highs: list[float] = []
    open_above = 0
    for _ in range(BOOTSTRAP_REPLICATES):
        resampled = [Point(p.users, [rng.choice(p.steps) for _ in p.steps]) for p in points]
        passing, failing = bracket(pass_map(tier, resampled))
        lows.append(float(passing or 0))
        if failing is None:
            open_above += 1
            highs.append(float(spec.high))
        else:
            highs.append(float(failing - 1))
    lo = percentile(sorted(lows), 2.5)
    hi = percentile(sorted(highs), 97.5)
    assert lo is not None and hi is not None
    upper = None if open_above / BOOTSTRAP_REPLICATES > 0.025 else math.floor(hi)
    return math.floor(lo), upper


@dataclass(frozen=True)
class Binding:
    """What misses the tier at a count: a constraint's statistic (measured, unsmoothed) or validity."""

    label: str
    value: float | None
    text: str  # the value as the constraint writes it, or the step's first reason


def binding_at(tier: SloTier, points: Sequence[Point], users: int) -> Binding:
    """The constraint that misses ``tier`` worst at ``users`` (by the smoothed statistic), else validity."""
    point = next(p for p in points if p.users == users)
    if not any(s.valid for s in point.steps):
        return Binding(VALIDITY, None, point.first_reason() or "no valid step")
    worst: tuple[float, SloConstraint] | None = None
    for constraint in tier.constraints:
        value = smoothed(constraint, points).get(users)
        if value is not None and constraint.passes(value):
            continue
        ratio = math.inf if value is None else constraint.violation(value)
        if worst is None or ratio > worst[0]:
            worst = (ratio, constraint)
    if worst is None:  # every statistic holds: a step of this count was not valid
        return Binding(VALIDITY, None, point.first_reason())
    constraint = worst[1]
    raw = point.raw(constraint.key)
    text = constraint.format_value(raw) if raw is not None else "not measured"
    return Binding(constraint.statistic_label, raw, text)


def _worsening(constraint: SloConstraint, below: float | None, above: float | None) -> float | None:
    """How many times worse ``above`` is than ``below`` for this constraint's figure."""
    if below is None or above is None:
        return None
    if constraint.figure.higher_is_better:
        return below / above if above > 0 else math.inf
    return above / below if below > 0 else (math.inf if above > 0 else 1.0)


def cliff_at(
    spec: CapacitySpec, tier: SloTier, points: Sequence[Point], below: int, above: int
) -> CliffRecord | None:
    """A cliff between two neighbouring counts: some constraint of the tier worsens more than the
    cliff factor from ``below`` to ``above`` (raw statistics), with the KV working set against the pool."""
    lo = next(p for p in points if p.users == below)
    hi = next(p for p in points if p.users == above)
    best: tuple[float, SloConstraint] | None = None
    for constraint in tier.constraints:
        factor = _worsening(constraint, lo.raw(constraint.key), hi.raw(constraint.key))
        if factor is not None and (best is None or factor > best[0]):
            best = (factor, constraint)
    if best is None or best[0] <= spec.cliff_factor:
        return None
    factor, constraint = best
    return CliffRecord(
        below_users=below,
        above_users=above,
        statistic=constraint.statistic_label,
        below_value=lo.raw(constraint.key),
        above_value=hi.raw(constraint.key),
        factor=factor if math.isfinite(factor) else None,
        kv_working_set_below=_int(lo.mean_of(lambda s: s.kv_working_set_tokens)),
        kv_pool_below=_int(lo.mean_of(lambda s: s.kv_pool_tokens)),
        kv_working_set_above=_int(hi.mean_of(lambda s: s.kv_working_set_tokens)),
        kv_pool_above=_int(hi.mean_of(lambda s: s.kv_pool_tokens)),
    )


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def search_stop_reason(states: Sequence[TierState], ended: StopReason | None) -> StopReason:
    """Why the search as a whole stopped: how it ended (budget, interrupt, engine), else what the tiers say."""
    if ended is not None:
        return ended
    kinds = {s.kind for s in states}
    if kinds == {"none"}:
        return "lowest count fails"
    if kinds == {"at_least"}:
        return "highest count passes"
    return "converged"


def tier_results(
    spec: CapacitySpec,
    steps: Sequence[StepRecord],
    *,
    gpus: int,
    ended: StopReason | None = None,
    power_w: Callable[[int], float | None] | None = None,
) -> tuple[StopReason, list[TierResult]]:
    """(the search's stop reason, one result per tier) for the steps so far.

    ``ended`` is how the search stopped when it did not run out of counts to measure (budget spent,
    interrupted, engine failed, step failed); a FAILED last step of an interrupted search, of one whose
    engine died, or the FAILED step that stopped it, measured nothing and is not judged (it stays in
    the step history). ``power_w(users)`` is the cell's mean GPU power in watts at a count (None where
    it was not measured): it gives agents per MW.
    """
    cut_short = ("interrupted", "engine failed", "step failed")
    if ended in cut_short and steps and steps[-1].status == "FAILED":
        steps = steps[:-1]  # the step the search was cut short in measured nothing
    points = points_of(steps)
    states = [tier_state(spec, t, points) for t in spec.tiers]
    reason = search_stop_reason(states, ended)
    return reason, [_result(spec, s, points, gpus, reason, power_w) for s in states]


def _result(
    spec: CapacitySpec,
    state: TierState,
    points: Sequence[Point],
    gpus: int,
    search_reason: StopReason,
    power_w: Callable[[int], float | None] | None,
) -> TierResult:
    tier = state.tier
    boundary: int | None
    interval: tuple[int, int | None] | None
    kind = "resolution"
    cliff = None
    binding: Binding | None = None
    stop: StopReason
    btype: BoundaryType
    if state.kind == "none":
        assert state.failing is not None
        boundary, interval, btype, stop = 0, (0, spec.low - 1), "none", "lowest count fails"
        binding = binding_at(tier, points, state.failing)
    elif state.kind == "at_least":
        boundary, interval, btype, stop = spec.high, (spec.high, None), "at_least", "highest count passes"
    elif state.resolved:
        assert state.passing is not None and state.failing is not None
        boundary, interval, stop = state.passing, (state.passing, state.failing - 1), "converged"
        binding = binding_at(tier, points, state.failing)
        cliff = cliff_at(spec, tier, points, state.passing, state.failing)
        btype = "cliff" if cliff is not None else "smooth"
    else:
        boundary = state.passing
        upper = None if state.failing is None else state.failing - 1
        interval = (state.passing or 0, upper) if points else None
        btype, stop = "unresolved", search_reason
        if state.failing is not None and state.passing is not None:
            binding = binding_at(tier, points, state.failing)
    if state.resolved and state.kind != "none":
        boot = _bootstrap_interval(spec, tier, points)
        if boot is not None and interval is not None:
            lo = min(boot[0], interval[0])
            hi = None if boot[1] is None or interval[1] is None else max(boot[1], interval[1])
            interval, kind = (lo, hi), "bootstrap"
    at = next((p for p in points if p.users == boundary), None)
    out_tps = at.mean_of(lambda s: s.output_tok_per_s_per_gpu) if at else None
    total_tps = at.mean_of(lambda s: s.total_tok_per_s_per_gpu) if at else None
    watts = power_w(boundary) if power_w is not None and boundary else None
    agents_per_mw = boundary / (watts / 1e6) if boundary and watts else None
    result = TierResult(
        tier=tier.name,
        description=tier.describe(),
        boundary_users=boundary,
        agents_per_gpu=None if boundary is None else boundary / gpus,
        interval_users=interval,
        interval_kind=kind,  # type: ignore[arg-type]
        boundary_type=btype,
        binding=binding.label if binding else None,
        binding_value=binding.value if binding else None,
        binding_users=state.failing if binding else None,
        output_tok_per_s_per_gpu=out_tps,
        total_tok_per_s_per_gpu=total_tps,
        agents_per_mw=agents_per_mw,
        cliff=cliff,
        stop_reason=stop,
        line="",
    )
    return result.model_copy(
        update={"line": tier_line(tier, result, gpus, binding.text if binding else None)}
    )
