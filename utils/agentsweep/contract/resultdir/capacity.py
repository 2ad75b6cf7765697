"""capacity.json: what a capacity cell's search found, per SLO tier, and every step it ran.

A capacity cell starts its engine once and runs measured steps, each a complete result directory of
its own under ``steps/<n>/`` (``step_dir``). capacity.json is written after every step and once more
when the search ends (also when it is interrupted or the engine dies), so it always describes the
steps on disk. Figures are in the engine's clock (a simulated engine's speed-up undone) and in each
figure's own unit (s, tok/s, a fraction); agents per GPU divide by every GPU of the cell.

A record is checked whole when it is made or read (``CapacityRecord``): the steps are numbered in
order inside the searched range; each tier's boundary lies in that range and its interval, its agents
per GPU are its users over the GPUs, what its boundary type says is backed by the steps (a boundary
at a count with a SUCCESS step, the count that binds it measured, a cliff between those two, "none"
measured at the lowest count, "at least" at the highest), and its stop reason fits its type.
``check_against`` then holds the record to the cell that wrote it and to the steps on disk.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir.fileio import read_model, write_atomic
from agentsweep.contract.resultdir.files import CAPACITY_JSON, STEPS_DIR
from agentsweep.contract.resultdir.record import read_cell_record
from agentsweep.contract.resultdir.status import read_status
from agentsweep.contract.verdict import Verdict
from agentsweep.errors import InputError

SCHEMA_VERSION = 1

# Why a search (or one tier's part of it) stopped.
StopReason = Literal[
    "converged",  # the boundary is bracketed as narrowly as the resolution asks
    "lowest count fails",  # even the search's lowest user count misses the tier: capacity 0
    "highest count passes",  # the highest user count still meets it: capacity >= high
    "budget spent",  # the next step would not fit the job's time limit
    "interrupted",  # SIGTERM/SIGINT/SIGHUP: the finished steps stand
    "engine failed",  # the engine died (or never came up): the finished steps stand
    "step failed",  # a step measured nothing (its replayer died, say): the steps before it stand
]
STOP_REASONS: tuple[str, ...] = get_args(StopReason)
# How a search stops before it resolved every tier: an unresolved tier's stop reason is one of these.
# (Only "budget spent" leaves the cell SUCCESS: the others are its FAILED verdict's reason.)
CUT_SHORT: tuple[str, ...] = ("budget spent", "interrupted", "engine failed", "step failed")
# What a resolved tier's boundary type says of its stop reason.
RESOLVED_STOP = {
    "smooth": "converged",
    "cliff": "converged",
    "none": "lowest count fails",
    "at_least": "highest count passes",
}
# smooth: the statistic crosses the line gradually; cliff: it jumps by more than the cliff factor
# between the two counts around the boundary; none: even the lowest count fails; at_least: the
# highest count passes; unresolved: the search stopped before bracketing it.
BoundaryType = Literal["smooth", "cliff", "none", "at_least", "unresolved"]
IntervalKind = Literal["resolution", "bootstrap"]


class _Model(BaseModel):
    """Strict and frozen; lists (as a writer builds them) stand for the tuples."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _tuples(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value


class StepRecord(_Model):
    """One measured run at one user count: where it is, its verdict and what it measured."""

    index: Annotated[int, Field(ge=0)]
    users: Annotated[int, Field(gt=0)]
    repeat: Annotated[int, Field(ge=0)] = 0
    dir: Annotated[str, Field(pattern=rf"^{STEPS_DIR}/[0-9]+$")]  # relative to the capacity cell: steps/<n>
    exp_name: str
    status: Verdict
    reasons: tuple[str, ...] = ()
    # Constraint key (``ttft:p90``) -> the statistic measured, in the figure's unit and engine clock.
    statistics: dict[str, float | None] = {}
    output_tok_per_s_per_gpu: float | None = None
    total_tok_per_s_per_gpu: float | None = None
    kv_working_set_tokens: int | None = None
    kv_pool_tokens: int | None = None
    wall_s: Annotated[float, Field(ge=0)] = 0.0
    start_utc: str | None = None
    end_utc: str | None = None

    @property
    def valid(self) -> bool:
        """Only a SUCCESS step can meet a tier."""
        return self.status == "SUCCESS"


class CliffRecord(_Model):
    """A boundary where the binding statistic jumps between two neighbouring steps."""

    below_users: int
    above_users: int
    statistic: str  # TTFT p90
    below_value: float | None
    above_value: float | None
    factor: float | None  # how many times worse above than below
    kv_working_set_below: int | None = None
    kv_pool_below: int | None = None
    kv_working_set_above: int | None = None
    kv_pool_above: int | None = None


class TierResult(_Model):
    """One tier's capacity: its boundary, what binds it, and the plain line that says it."""

    tier: str
    description: str  # interactive (TTFT p90 ≤ 10 s, speed p25 ≥ 20 tok/s)
    boundary_users: Annotated[int, Field(ge=0)] | None  # largest count meeting the tier; None: unresolved
    agents_per_gpu: float | None
    interval_users: tuple[int, int | None] | None = None  # (low, high); high None: open above
    interval_kind: IntervalKind = "resolution"
    boundary_type: BoundaryType
    binding: str | None = None  # the statistic that fails first above the boundary (or "validity")
    binding_value: float | None = None  # its value there, in the figure's unit
    binding_users: int | None = None  # the user count it was measured at
    output_tok_per_s_per_gpu: float | None = None  # at the boundary
    total_tok_per_s_per_gpu: float | None = None
    agents_per_mw: float | None = None  # where the boundary's step measured power
    cliff: CliffRecord | None = None
    stop_reason: StopReason
    line: str  # the one plain line (log and report)


class CapacityRecord(_Model):
    """capacity.json."""

    schema_version: Literal[1] = 1
    exp_name: str
    gpus: Annotated[int, Field(gt=0)]
    low: Annotated[int, Field(gt=0)]
    high: Annotated[int, Field(gt=0)]
    resolution: float
    repeats: Annotated[int, Field(gt=0)]
    cliff_factor: float
    time_limit_s: Annotated[float, Field(gt=0)]
    step_budget: Annotated[int, Field(ge=0)]  # steps the time limit holds, as planned before the search
    stop_reason: StopReason
    engine_s: Annotated[float, Field(ge=0)] = 0.0  # wall seconds from the engine's start to its stop
    tiers: tuple[TierResult, ...] = ()
    steps: tuple[StepRecord, ...] = ()

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, allow_nan=False) + "\n"

    @model_validator(mode="after")
    def _consistent(self) -> CapacityRecord:
        problem = self._steps_problem() or next(filter(None, map(self._tier_problem, self.tiers)), None)
        if problem is None:
            problem = self._stop_problem()
        if problem:
            raise ValueError(problem)
        return self

    def _steps_problem(self) -> str | None:
        if self.low > self.high:
            return f"searched range low {self.low} > high {self.high}"
        for i, step in enumerate(self.steps):
            if step.index != i or step.dir != f"{STEPS_DIR}/{i}":
                return f"steps[{i}]: index {step.index} in {step.dir}, expected {i} in {STEPS_DIR}/{i}"
            if not self.low <= step.users <= self.high:
                return f"steps[{i}]: {step.users} users outside the searched range {self.low}..{self.high}"
        names = [t.tier for t in self.tiers]
        twice = next((n for n in names if names.count(n) > 1), None)
        return f"tier {twice!r} listed twice" if twice is not None else None

    def _tier_problem(self, tier: TierResult) -> str | None:
        where = f"tiers {tier.tier!r}"
        users = tier.boundary_users
        measured = {s.users for s in self.steps}
        passed = {s.users for s in self.steps if s.status == "SUCCESS"}
        if users is not None and users > self.high:
            return f"{where}: boundary {users} users above the searched range {self.low}..{self.high}"
        if (users is None) != (tier.agents_per_gpu is None) or (
            users is not None
            and tier.agents_per_gpu is not None
            and not math.isclose(tier.agents_per_gpu, users / self.gpus, rel_tol=1e-9)
        ):
            return f"{where}: {tier.agents_per_gpu} agents per GPU for {users} users on {self.gpus} GPU(s)"
        if tier.interval_users is not None:
            lo, hi = tier.interval_users
            top = self.high if hi is None else hi
            if lo < 0 or top > self.high or lo > top or (users is not None and not lo <= users <= top):
                return f"{where}: interval {lo}..{hi} does not hold boundary {users} within 0..{self.high}"
        if tier.binding_users is not None and tier.binding_users not in measured:
            return f"{where}: bound at {tier.binding_users} users, where no step ran"
        kind = tier.boundary_type
        if kind == "none":
            if users != 0 or self.low not in measured:
                return f"{where}: capacity 0 needs boundary 0 and a step at the lowest count {self.low}"
        elif kind == "at_least":
            if users != self.high or self.high not in passed:
                return f"{where}: 'at least' needs boundary {self.high} with a SUCCESS step there"
        elif kind in ("smooth", "cliff"):
            if users is None or not self.low <= users < self.high or users not in passed:
                return f"{where}: boundary {users} users has no SUCCESS step in {self.low}..{self.high - 1}"
            if tier.binding_users is None or tier.binding_users <= users:
                return f"{where}: boundary {users} users is bound at no measured count above it"
        elif users is not None and users not in passed:
            return f"{where}: boundary {users} users has no SUCCESS step"
        cliff = tier.cliff
        if (cliff is not None) != (kind == "cliff") or (
            cliff is not None and (cliff.below_users, cliff.above_users) != (users, tier.binding_users)
        ):
            return f"{where}: a {kind} boundary with cliff {cliff and (cliff.below_users, cliff.above_users)}"
        want = RESOLVED_STOP.get(kind)
        if (want is not None and tier.stop_reason != want) or (
            kind == "unresolved" and tier.stop_reason != self.stop_reason
        ):
            return f"{where}: a {kind} boundary stopped by {tier.stop_reason!r}"
        return None

    def _stop_problem(self) -> str | None:
        kinds = {t.boundary_type for t in self.tiers}
        if "unresolved" in kinds and self.stop_reason not in CUT_SHORT:
            return f"stop_reason {self.stop_reason!r} with a tier unresolved"
        if self.stop_reason == "lowest count fails" and kinds != {"none"}:
            return f"stop_reason {self.stop_reason!r} but tiers are {', '.join(sorted(kinds))}"
        if self.stop_reason == "highest count passes" and kinds != {"at_least"}:
            return f"stop_reason {self.stop_reason!r} but tiers are {', '.join(sorted(kinds))}"
        return None

    def check_against(self, cell: Cell, verdict: Verdict, result_dir: Path) -> str | None:
        """What contradicts the cell that wrote this record (its name, GPUs and search range, its
        verdict: a SUCCESS search measured a step and stopped on its own) or the steps on disk (each
        listed step's cell.json and status.txt: its count and verdict); None when nothing does."""
        spec = cell.capacity
        if spec is None:
            return "capacity.json beside a cell that searches nothing"
        if verdict == "SUCCESS" and (not self.steps or self.stop_reason in CUT_SHORT[1:]):
            return (
                f"capacity.json: a SUCCESS cell whose search stopped by {self.stop_reason!r} after "
                f"{len(self.steps)} step(s)"
            )
        mine = (self.exp_name, self.gpus, self.low, self.high)
        theirs = (cell.exp_name, cell.gpus, spec.low, spec.high)
        if mine != theirs:
            return f"capacity.json: (exp_name, gpus, low, high) {mine} but the cell's are {theirs}"
        for i, step in enumerate(self.steps):
            sdir = result_dir / step.dir
            try:
                record = read_cell_record(sdir)
                status = read_status(sdir)
            except InputError as err:
                return f"capacity.json: steps[{i}]: {step.dir}/{err}"
            if record is None or status is None:
                return f"capacity.json: steps[{i}]: {step.dir} holds no finished step"
            if (record.cell.get("users"), status.verdict) != (step.users, step.status):
                return (
                    f"capacity.json: steps[{i}]: {step.users} users {step.status}, but {step.dir} ran "
                    f"{record.cell.get('users')} users: {status.verdict}"
                )
        return None


def step_dir(result_dir: Path, index: int) -> Path:
    """The result directory of search step ``index``: ``steps/<index>``."""
    return result_dir / STEPS_DIR / str(index)


def write_capacity(result_dir: Path, record: CapacityRecord) -> None:
    write_atomic(result_dir / CAPACITY_JSON, record.to_json())


def read_capacity(result_dir: Path) -> CapacityRecord | None:
    """capacity.json of ``result_dir``, None when absent; ResultFileError when it breaks the contract."""
    return read_model(result_dir, CAPACITY_JSON, CapacityRecord)
