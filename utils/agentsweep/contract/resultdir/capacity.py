"""capacity.json: what a capacity cell's search found, per SLO tier, and every step it ran.

A capacity cell starts its engine once and runs measured steps, each a complete result directory of
its own under ``steps/<n>/`` (``step_dir``). capacity.json is written after every step and once more
when the search ends (also when it is interrupted or the engine dies), so it always describes the
steps on disk. Figures are in the engine's clock (a simulated engine's speed-up undone) and in each
figure's own unit (s, tok/s, a fraction); agents per GPU divide by every GPU of the cell.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentsweep.contract.resultdir.fileio import read_model, write_atomic
from agentsweep.contract.resultdir.files import CAPACITY_JSON, STEPS_DIR
from agentsweep.contract.verdict import Verdict

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


def step_dir(result_dir: Path, index: int) -> Path:
    """The result directory of search step ``index``: ``steps/<index>``."""
    return result_dir / STEPS_DIR / str(index)


def write_capacity(result_dir: Path, record: CapacityRecord) -> None:
    write_atomic(result_dir / CAPACITY_JSON, record.to_json())


def read_capacity(result_dir: Path) -> CapacityRecord | None:
    """capacity.json of ``result_dir``, None when absent; ResultFileError when it breaks the contract."""
    return read_model(result_dir, CAPACITY_JSON, CapacityRecord)
