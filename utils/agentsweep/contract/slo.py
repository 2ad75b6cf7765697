"""Service-level tiers and the capacity search a cell may run instead of a fixed user count.

A tier is a name and constraints; a constraint is a per-request figure of
``kv_cache_tester.metrics.SLO_FIGURES`` (TTFT, E2E, TPOT, output speed, error share), a statistic
(``mean`` or a percentile ``p1``..``p99.9``), a comparison and a threshold with its unit:
``ttft p90 <= 10 s``, ``speed p25 >= 20 tok/s``, ``error_share mean <= 1 %``. The figures, and the
direction each percentile takes, are defined once in ``kv_cache_tester.metrics``.

A config entry's ``slo:`` block maps tier names to lists of constraints (each the text above, or a
mapping ``{metric, stat, op, value, unit}``) and replaces ``DEFAULT_TIERS``; ``--slo "NAME: C, C"`` does
the same for one run. A search-space point asks for a search with ``users: {search: [LOW, HIGH]}``
(``UserSearch``); the matrix turns it into a cell carrying ``CapacitySpec`` (the range, the search
options, the tiers and the job's time limit), which the capacity cell runs (docs/capacity.md).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal, get_args

from kv_cache_tester.metrics import SLO_FIGURES, SloFigure
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentsweep.contract.errors import brief, suggest, validation_message

SloMetric = Literal["ttft", "e2e", "tpot", "output_speed", "error_share"]
Comparison = Literal["<=", "<", ">=", ">"]
SLO_METRICS: tuple[str, ...] = get_args(SloMetric)
# Other names a constraint may use for a metric.
METRIC_ALIASES = {"speed": "output_speed", "errors": "error_share", "error_rate": "error_share"}
_COMPARISONS = {"<=": "<=", "<": "<", ">=": ">=", ">": ">", "≤": "<=", "≥": ">=", "=<": "<=", "=>": ">="}
_SHOWN_COMPARISON = {"<=": "≤", "<": "<", ">=": "≥", ">": ">"}
# Units a threshold may be written in, per figure unit: name -> factor to the figure's own unit.
UNITS: dict[str, dict[str, float]] = {
    "s": {"s": 1.0, "ms": 1e-3},
    "tok/s": {"tok/s": 1.0},
    "share": {"": 1.0, "%": 0.01},
}
MIN_PERCENTILE, MAX_PERCENTILE = 1.0, 99.9
MAX_USERS_SEARCHED = 100_000
MAX_REPEATS = 20
MAX_TIERS = 16
MAX_CONSTRAINTS = 16
TIER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
_STAT = re.compile(r"^(mean|p(\d{1,6}(?:\.\d{1,6})?))$")
_CONSTRAINT = re.compile(
    r"^\s*(?P<metric>[A-Za-z_][A-Za-z0-9_]*)\s+(?:(?P<stat>[A-Za-z]+[\d.]*)\s*)?(?P<op><=|>=|=<|=>|≤|≥|<|>)\s*"
    r"(?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>[A-Za-z/%]*)\s*$"
)


class SloError(ValueError):
    """A tier or constraint that cannot be read; ``path`` is where (``interactive[1]``) within its block."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _figure_name(name: Any) -> Any:
    if not isinstance(name, str):
        return name
    low = name.strip().lower()
    return METRIC_ALIASES.get(low, low)


class SloConstraint(_Frozen):
    """One constraint of a tier: ``<figure> <statistic> <comparison> <value> <unit>``."""

    metric: SloMetric
    stat: str = "mean"
    op: Comparison
    value: Annotated[float, Field(ge=0)]
    unit: str = ""

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        """The text form (``ttft p90 <= 10 s``) as the mapping form; names and signs normalized."""
        if isinstance(data, str):
            data = parse_constraint_text(data)
        if not isinstance(data, dict):
            raise ValueError(f"expected a constraint like 'ttft p90 <= 10 s', got {brief(data)}")
        out = dict(data)
        if "metric" in out:
            metric = _figure_name(out["metric"])
            if isinstance(metric, str) and metric not in SLO_METRICS:
                names = [*SLO_METRICS, *METRIC_ALIASES]
                raise ValueError(
                    f"unknown metric {brief(out['metric'])}{suggest(metric, names)}; "
                    f"use one of {', '.join(SLO_METRICS)}"
                )
            out["metric"] = metric
        if isinstance(out.get("op"), str):
            op = _COMPARISONS.get(out["op"].strip())
            if op is None:
                raise ValueError(f"unknown comparison {brief(out['op'])}; use <=, <, >= or >")
            out["op"] = op
        if isinstance(out.get("stat"), str):
            out["stat"] = _normalize_stat(out["stat"])
        if isinstance(out.get("value"), int) and not isinstance(out.get("value"), bool):
            out["value"] = float(out["value"])
        if out.get("unit") is None and isinstance(out.get("metric"), str):
            out["unit"] = _default_unit(out["metric"])
        return out

    @model_validator(mode="after")
    def _consistent(self) -> SloConstraint:
        figure = self.figure
        if figure.only_mean and self.stat != "mean":
            raise ValueError(f"{self.metric} is one figure per run: use 'mean', not {self.stat!r}")
        units = UNITS[figure.unit]
        if self.unit not in units:
            shown = ", ".join(repr(u) if u else "'' (a fraction)" for u in units)
            raise ValueError(f"unit {self.unit!r} does not fit {self.metric}; use {shown}")
        if figure.unit == "share" and self.threshold > 1:
            raise ValueError(f"an error share is at most 1 (100 %), got {self.value:g}{self.unit}")
        return self

    @property
    def figure(self) -> SloFigure:
        return SLO_FIGURES[self.metric]

    @property
    def threshold(self) -> float:
        """The value in the figure's own unit (s, tok/s, a fraction)."""
        return self.value * UNITS[self.figure.unit][self.unit]

    @property
    def percentile(self) -> float | None:
        """The percentile (0-100) of the statistic, None for the mean."""
        return None if self.stat == "mean" else float(self.stat[1:])

    @property
    def key(self) -> str:
        """The measured statistic this constraint reads (tiers share measurements): ``ttft:p90``."""
        return f"{self.metric}:{self.stat}"

    @property
    def statistic_label(self) -> str:
        """``TTFT p90``, ``speed p25``, ``errors`` (what a line names as binding)."""
        figure = self.figure
        return figure.label if figure.only_mean else f"{figure.label} {self.stat}"

    def passes(self, measured: float) -> bool:
        """Whether a measured statistic (in the figure's own unit) meets this constraint."""
        limit = self.threshold
        if self.op == "<=":
            return measured <= limit
        if self.op == "<":
            return measured < limit
        if self.op == ">=":
            return measured >= limit
        return measured > limit

    def violation(self, measured: float) -> float:
        """How far a measurement misses (>1) or meets (<=1) the constraint, as a ratio."""
        limit = self.threshold
        if self.figure.higher_is_better:
            return limit / measured if measured > 0 else math.inf
        return measured / limit if limit > 0 else (math.inf if measured > 0 else 0.0)

    def format_value(self, measured: float) -> str:
        """A measurement in this constraint's unit: ``12.3 s``, ``18.0 tok/s``, ``2.5 %``."""
        return f"{_num(measured / UNITS[self.figure.unit][self.unit])}{_unit_suffix(self.unit)}"

    def text(self) -> str:
        """The constraint as the config and ``--slo`` write it: ``ttft p90 <= 10 s``."""
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.metric} {self.stat} {self.op} {self.value:g}{unit}"

    def describe(self) -> str:
        """``TTFT p90 ≤ 10 s``."""
        return (
            f"{self.statistic_label} {_SHOWN_COMPARISON[self.op]} {_num(self.value)}{_unit_suffix(self.unit)}"
        )


def statistic_label(key: str) -> str:
    """A measured statistic's key (``ttft:p90``) as a chart names it: ``TTFT p90 (s)``; the key
    itself for one no figure defines."""
    metric, _, stat = key.partition(":")
    figure = SLO_FIGURES.get(METRIC_ALIASES.get(metric, metric))
    if figure is None:
        return key
    name = figure.label if figure.only_mean or not stat else f"{figure.label} {stat}"
    unit = "fraction" if figure.unit == "share" else figure.unit
    return f"{name} ({unit})"


def _unit_suffix(unit: str) -> str:
    return f" {unit}" if unit else ""


def _num(value: float) -> str:
    if value == 0 or 0.01 <= abs(value) < 1e6:
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{value:.3g}"


def _default_unit(metric: str) -> str:
    unit = SLO_FIGURES[metric].unit
    return "" if unit == "share" else unit


def _normalize_stat(text: str) -> str:
    low = text.strip().lower()
    match = _STAT.match(low)
    if not match:
        raise ValueError(
            f"unknown statistic {brief(text)}; use mean or a percentile p1..p99.9 (p25, p90, p99.9)"
        )
    if match.group(1) == "mean":
        return "mean"
    p = float(match.group(2))
    if not MIN_PERCENTILE <= p <= MAX_PERCENTILE:
        raise ValueError(f"percentile {brief(text)} is outside p1..p99.9")
    return f"p{p:g}"


def parse_constraint_text(text: str) -> dict[str, Any]:
    """``ttft p90 <= 10 s`` as ``{metric, stat, op, value, unit}`` (names not yet checked)."""
    match = _CONSTRAINT.match(text)
    if not match:
        raise ValueError(
            f"cannot read {brief(text)}; write METRIC STAT OP VALUE UNIT, e.g. 'ttft p90 <= 10 s' "
            "or 'speed p25 >= 20 tok/s'"
        )
    out: dict[str, Any] = {
        "metric": match.group("metric"),
        "op": match.group("op"),
        "value": float(match.group("value")),
        "unit": match.group("unit"),
    }
    if match.group("stat"):
        out["stat"] = match.group("stat")
    if not out["unit"]:
        out["unit"] = None  # the figure's own unit
    return out


class SloTier(_Frozen):
    """A named tier: a user count meets it when every constraint holds (and the run was valid)."""

    name: Annotated[str, Field(pattern=TIER_NAME.pattern)]
    constraints: Annotated[tuple[SloConstraint, ...], Field(min_length=1, max_length=MAX_CONSTRAINTS)]

    @field_validator("constraints", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    def text(self) -> str:
        """The tier as ``--slo`` takes it: ``interactive: ttft p90 <= 10 s, output_speed p25 >= 20 tok/s``."""
        return f"{self.name}: {', '.join(c.text() for c in self.constraints)}"

    def describe(self) -> str:
        """``interactive (TTFT p90 ≤ 10 s, speed p25 ≥ 20 tok/s)``."""
        return f"{self.name} ({', '.join(c.describe() for c in self.constraints)})"


def _tier(name: Any, constraints: Any, where: str) -> SloTier:
    if not isinstance(name, str) or not TIER_NAME.match(name):
        raise SloError(where, f"tier name {brief(name)}: use letters, digits, '_', '.', '-' (at most 40)")
    if isinstance(constraints, str | dict):
        constraints = [constraints]
    if not isinstance(constraints, list | tuple):
        raise SloError(where, f"expected a list of constraints, got {brief(constraints)}")
    if not constraints:
        raise SloError(where, "an empty tier: give at least one constraint, e.g. 'ttft p90 <= 10 s'")
    if len(constraints) > MAX_CONSTRAINTS:
        raise SloError(where, f"{len(constraints)} constraints; at most {MAX_CONSTRAINTS}")
    parsed = []
    for i, raw in enumerate(constraints):
        try:
            parsed.append(SloConstraint.model_validate(raw))
        except ValidationError as err:
            field, what = validation_message(err, SloConstraint)
            raise SloError(f"{where}[{i}]", f"{field}: {what}" if field else what) from None
        except ValueError as err:
            raise SloError(f"{where}[{i}]", str(err)) from None
    return SloTier(name=name, constraints=tuple(parsed))


def parse_tiers(value: Any) -> tuple[SloTier, ...]:
    """A config's ``slo:`` block (tier name -> constraints) as tiers; ``SloError`` names the place."""
    if isinstance(value, list | tuple) and all(isinstance(t, SloTier) for t in value) and value:
        return tuple(value)
    if not isinstance(value, dict):
        raise SloError("", f"expected a mapping of tier names to constraint lists, got {brief(value)}")
    if not value:
        raise SloError("", "no tiers: give at least one, e.g. interactive: ['ttft p90 <= 10 s']")
    if len(value) > MAX_TIERS:
        raise SloError("", f"{len(value)} tiers; at most {MAX_TIERS}")
    return tuple(_tier(name, constraints, str(name)) for name, constraints in value.items())


def parse_tier_text(text: str) -> SloTier:
    """The command-line form ``NAME: CONSTRAINT, CONSTRAINT``."""
    name, colon, rest = text.partition(":")
    if not colon:
        raise SloError(
            "", f"cannot read {brief(text)}; write NAME: CONSTRAINT, ... e.g. 'fast: ttft p90 <= 2 s'"
        )
    parts = [p for p in (part.strip() for part in rest.split(",")) if p]
    return _tier(name.strip(), parts, name.strip())


def check_unique(tiers: tuple[SloTier, ...]) -> tuple[SloTier, ...]:
    seen: set[str] = set()
    for tier in tiers:
        if tier.name in seen:
            raise SloError(tier.name, "a second tier of this name")
        seen.add(tier.name)
    return tiers


# AgentPerf-style tiers: a per-request output speed floor at p25 (three requests in four at least that
# fast) with a TTFT ceiling at p90 (nine requests in ten start within it).
DEFAULT_TIERS: tuple[SloTier, ...] = parse_tiers(
    {
        "interactive": ["ttft p90 <= 10 s", "output_speed p25 >= 20 tok/s"],
        "fast": ["ttft p90 <= 5 s", "output_speed p25 >= 50 tok/s"],
        "realtime": ["ttft p90 <= 2 s", "output_speed p25 >= 100 tok/s"],
    }
)

DEFAULT_CLIFF_FACTOR = 3.0


class UserSearch(_Frozen):
    """A config point's ``users: {search: [LOW, HIGH], ...}``: search the users instead of listing them.

    ``resolution`` 0 bisects to whole users; a fraction (0.1) stops once the bracket is within that
    share of the lower count. ``repeats`` runs each searched count that many times (a bootstrap gives
    the boundary's interval). ``cliff_factor``: a binding statistic that worsens more than this many
    times between the neighbouring counts around a boundary makes it a cliff. ``time_limit_min``: the
    job's time limit the steps must fit (default: the runner's).
    """

    search: tuple[
        Annotated[int, Field(gt=0, le=MAX_USERS_SEARCHED)], Annotated[int, Field(gt=0, le=MAX_USERS_SEARCHED)]
    ]
    resolution: Annotated[float, Field(ge=0, lt=1)] = 0.0
    repeats: Annotated[int, Field(gt=0, le=MAX_REPEATS)] = 1
    cliff_factor: Annotated[float, Field(gt=1, le=1000)] = DEFAULT_CLIFF_FACTOR
    time_limit_min: Annotated[int, Field(gt=0, le=30 * 24 * 60)] | None = None

    @field_validator("search", mode="before")
    @classmethod
    def _pair(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) == 2:
            return tuple(value)
        if isinstance(value, tuple) and len(value) == 2:
            return value
        raise ValueError(f"expected [LOW, HIGH], two user counts, got {brief(value)}")

    @model_validator(mode="after")
    def _ordered(self) -> UserSearch:
        low, high = self.search
        if low > high:
            raise ValueError(f"search range [{low}, {high}]: low {low} > high {high}")
        return self

    @property
    def low(self) -> int:
        return self.search[0]

    @property
    def high(self) -> int:
        return self.search[1]


class CapacitySpec(_Frozen):
    """What a capacity cell searches: its range, search options, tiers and the job's time limit."""

    low: Annotated[int, Field(gt=0, le=MAX_USERS_SEARCHED)]
    high: Annotated[int, Field(gt=0, le=MAX_USERS_SEARCHED)]
    resolution: Annotated[float, Field(ge=0, lt=1)] = 0.0
    repeats: Annotated[int, Field(gt=0, le=MAX_REPEATS)] = 1
    cliff_factor: Annotated[float, Field(gt=1, le=1000)] = DEFAULT_CLIFF_FACTOR
    time_limit_min: Annotated[int, Field(gt=0, le=30 * 24 * 60)]
    tiers: Annotated[tuple[SloTier, ...], Field(min_length=1, max_length=MAX_TIERS)]

    @field_validator("tiers", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _ordered(self) -> CapacitySpec:
        if self.low > self.high:
            raise ValueError(f"search range low {self.low} > high {self.high}")
        try:
            check_unique(self.tiers)
        except SloError as err:
            raise ValueError(f"tiers: {err.path}: {err}") from None
        return self

    @property
    def constraints(self) -> list[SloConstraint]:
        """Every distinct measured statistic of the tiers, once each (by ``key``)."""
        return distinct_constraints(self.tiers)

    def gap_resolved(self, passing: int, failing: int) -> bool:
        """Whether a bracket (passing < failing) is as narrow as the resolution asks."""
        return failing - passing <= max(1, math.floor(self.resolution * passing))


def distinct_constraints(tiers: tuple[SloTier, ...]) -> list[SloConstraint]:
    """One constraint per measured statistic across ``tiers`` (the first of each key)."""
    seen: dict[str, SloConstraint] = {}
    for tier in tiers:
        for constraint in tier.constraints:
            seen.setdefault(constraint.key, constraint)
    return list(seen.values())
