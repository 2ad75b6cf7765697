"""Read the store: runs, points, curves per scope, the latest run per scope, history, diffs.

A change between two measurements is flagged only beyond the noise measured for them, never on a
bare threshold:
- a point's stability block gives, per metric, the min and max over its sub-windows, and for a
  throughput its value ± 2 standard errors over the same sub-windows (result_files.read_throughput_noise):
  the base's range and the head's range must not overlap (one range alone: the other value must lie
  outside it);
- without one, the spread (min..max) of the base measurement's repeats in the store (same identity
  and recipe fingerprint, two or more points, the head left out), and the head must lie outside it;
- with neither, the change is shown with "no noise figure" and not flagged.
"""

from __future__ import annotations

import difflib
import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kv_cache_tester.metrics import finite
from sqlalchemy import Connection, func, select

from agentsweep.contract import columns
from agentsweep.contract.errors import printable
from agentsweep.errors import InputError
from agentsweep.store import schema
from agentsweep.store.db import DamagedStore
from agentsweep.store.scope import FILTER_FIELDS, POSITION_FIELDS, SCOPE_FIELDS, identity

# What `results diff` compares unless told otherwise.
DIFF_METRICS = (
    "total_tok_per_s_per_gpu",
    "output_tok_per_s_per_gpu",
    "ttft_p90_s",
    "e2e_p90_s",
    "interactivity_p90_tok_per_s",
)


def stored_metrics() -> tuple[str, ...]:
    """Every metric a point can hold: collect's numeric summary.csv columns (ingest keeps those)."""
    text = (columns.Unit.JSON, columns.Unit.LABEL)
    return tuple(c.name for c in columns.METRICS if c.unit not in text)


def check_metric(name: str, flag: str = "--metric") -> str:
    """``name`` when it is a stored metric; else InputError naming the closest ones."""
    known = stored_metrics()
    if name in known:
        return name
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see docs/collect.md for the columns"
    raise InputError(f"{flag} {printable(name)!r}: no such metric{hint}")


@dataclass
class Run:
    id: int
    label: str
    source: str
    commit: str | None
    started_utc: str | None
    ingested_utc: str
    points: int = 0
    success: int = 0


@dataclass
class Point:
    id: int
    run: Run
    exp_name: str
    config_key: str
    status: str
    reason: str
    notes: str
    scope_key: str
    scope: dict[str, str]
    position: dict[str, int]
    commit: str | None
    start_utc: str | None
    receipt_id: str
    recipe_fingerprint: str
    metrics: dict[str, float] = field(default_factory=dict)
    noise: dict[str, tuple[float, float]] = field(default_factory=dict)
    noise_source: dict[str, str] = field(default_factory=dict)  # metric -> what its range is
    labels: dict[str, str] = field(default_factory=dict)
    slo_run: dict[str, Any] = field(default_factory=dict)  # result_files.PointFacts.slo_run
    # A capacity cell: its figures are its steps' (points of their own) and its capacity.json; it
    # lies on no curve, in no history and in no diff itself.
    capacity: bool = False
    capacity_cell: dict[str, Any] | None = None  # the capacity cell's cell, as cell.json holds it

    @property
    def facts(self) -> dict[str, str | int]:
        return {**self.scope, **self.position, "config_key": self.config_key}

    @property
    def identity(self) -> tuple[str, ...]:
        return identity(self.facts)

    @property
    def when(self) -> tuple[str, int]:
        """Order of runs: start date, then ingest order."""
        return (self.run.started_utc or self.run.ingested_utc, self.run.id)


def higher_is_better(metric: str) -> bool | None:
    """Which way a metric improves (None when it has no better direction)."""
    if metric.endswith(("tok_per_s", "tok_per_s_per_gpu", "hit_rate", "requests_per_s", "attainment")):
        return True
    if metric.endswith("_s"):
        return False
    return None


# --- loading ----------------------------------------------------------------------------------


def list_runs(conn: Connection) -> list[Run]:
    r, p = schema.runs, schema.points
    counts: dict[int, int] = dict(conn.execute(select(p.c.run_id, func.count()).group_by(p.c.run_id)).all())
    ok: dict[int, int] = dict(
        conn.execute(
            select(p.c.run_id, func.count()).where(p.c.status == "SUCCESS").group_by(p.c.run_id)
        ).all()
    )
    runs = []
    for row in conn.execute(select(r).order_by(r.c.id)).mappings():
        runs.append(
            Run(
                id=row["id"],
                label=row["label"],
                source=row["source"],
                commit=row["commit"],
                started_utc=row["started_utc"],
                ingested_utc=row["ingested_utc"],
                points=int(counts.get(row["id"], 0)),
                success=int(ok.get(row["id"], 0)),
            )
        )
    return runs


def find_run(runs: Sequence[Run], ref: str, what: str) -> Run:
    """A run by id, by label, or ``latest``."""
    if not runs:
        raise InputError(f"{what} {ref!r}: the store holds no runs")
    if ref == "latest":
        return max(runs, key=lambda r: (r.started_utc or r.ingested_utc, r.id))
    if ref.isdigit():
        for run in runs:
            if run.id == int(ref):
                return run
    matches = [run for run in runs if run.label == ref]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        ids = ", ".join(str(r.id) for r in matches)
        raise InputError(f"{what} {ref!r}: {len(matches)} runs have that label (ids {ids}); give an id")
    known = ", ".join(f"{r.id} ({r.label})" for r in runs[-8:])
    raise InputError(f"{what} {ref!r}: no such run; runs: {known}")


def load_points(
    conn: Connection,
    where: Mapping[str, str] | None = None,
    run_ids: Iterable[int] | None = None,
    metrics: Iterable[str] | None = None,
) -> list[Point]:
    """Points matching ``where`` (field=value, see scope.FILTER_FIELDS), with their metrics (only
    ``metrics`` when given), in run order then by name."""
    p, m = schema.points, schema.metrics
    runs = {run.id: run for run in list_runs(conn)}
    query = select(p)
    for name, value in (where or {}).items():
        if name not in FILTER_FIELDS:
            raise InputError(f"no field {name!r} to select points on")
        column = p.c[name]
        query = query.where(column == (int(value) if name in POSITION_FIELDS and value.isdigit() else value))
    if run_ids is not None:
        query = query.where(p.c.run_id.in_(list(run_ids)))
    points: dict[int, Point] = {}
    for row in conn.execute(query).mappings():
        noise, noise_source, labels, slo_run = _stability(row["id"], row["stability_json"])
        points[row["id"]] = Point(
            id=row["id"],
            run=runs[row["run_id"]],
            exp_name=row["exp_name"],
            config_key=row["config_key"],
            status=row["status"],
            reason=row["reason"],
            notes=row["notes"],
            scope_key=row["scope_key"],
            scope={name: row[name] for name in SCOPE_FIELDS},
            position={name: row[name] for name in POSITION_FIELDS},
            commit=row["commit"],
            start_utc=row["start_utc"],
            receipt_id=row["receipt_id"],
            recipe_fingerprint=row["recipe_fingerprint"],
            noise=noise,
            noise_source=noise_source,
            labels=labels,
            slo_run=slo_run,
            capacity_cell=_capacity_cell(row["cell_json"]),
        )
        points[row["id"]].capacity = points[row["id"]].capacity_cell is not None
    if points:
        mq = select(m.c.point_id, m.c.name, m.c.value)
        if metrics is not None:
            mq = mq.where(m.c.name.in_(list(metrics)))
        ids = list(points)
        for i in range(0, len(ids), 500):
            for found in conn.execute(mq.where(m.c.point_id.in_(ids[i : i + 500]))):
                points[int(found.point_id)].metrics[str(found.name)] = _metric(found)
    return sorted(points.values(), key=lambda pt: (pt.when, pt.exp_name))


def _capacity_cell(cell_json: str | None) -> dict[str, Any] | None:
    """A capacity cell's cell.json cell; None for every other point."""
    try:
        cell = json.loads(cell_json or "{}")
    except ValueError:
        return None
    return cell if isinstance(cell, dict) and cell.get("capacity") else None


def measured(points: Iterable[Point]) -> list[Point]:
    """The points that carry figures of their own: every point but the capacity cells."""
    return [p for p in points if not p.capacity]


def _stability(
    point_id: int, text: str | None
) -> tuple[dict[str, tuple[float, float]], dict[str, str], dict[str, Any], dict[str, Any]]:
    """(noise ranges, what each range is, labels, the run's SLO reading) of a point's stability_json as
    ingest wrote it; DamagedStore otherwise. A throughput range comes from the run's sub-windows, a
    latency or interactivity range from the stability block."""
    try:
        extra = json.loads(text or "{}")
        throughput = {
            str(k): (_finite(v[0]), _finite(v[1])) for k, v in (extra.get("throughput_ranges") or {}).items()
        }
        stability = {str(k): (_finite(v[0]), _finite(v[1])) for k, v in (extra.get("ranges") or {}).items()}
        source = {**dict.fromkeys(throughput, "sub-windows"), **dict.fromkeys(stability, "stability")}
        return (
            {**throughput, **stability},
            source,
            dict(extra.get("labels") or {}),
            dict(extra.get("slo_run") or {}),
        )
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as err:
        raise DamagedStore(f"point {point_id}: stability_json does not decode ({err})") from None


def _finite(value: Any) -> float:
    """A stored figure (a number or its text) as a finite float; ValueError or TypeError otherwise."""
    number = finite(float(value))
    if number is None:
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _metric(found: Any) -> float:
    try:
        return _finite(found.value)
    except (ValueError, TypeError):
        raise DamagedStore(
            f"point {found.point_id}: metric {str(found.name)[:80]}: {str(found.value)[:40]!r} is not a number"
        ) from None


# --- curves -----------------------------------------------------------------------------------


@dataclass
class Curve:
    scope_key: str
    scope: dict[str, str]
    run: Run
    points: list[Point]


def curves(points: Sequence[Point], latest: bool = False) -> list[Curve]:
    """Points grouped by (scope, run); with ``latest`` only each scope's newest run."""
    grouped: dict[tuple[str, int], list[Point]] = defaultdict(list)
    for point in measured(points):
        grouped[(point.scope_key, point.run.id)].append(point)
    out = [
        Curve(
            key, pts[0].scope, pts[0].run, sorted(pts, key=lambda p: (p.position["tp"], p.position["users"]))
        )
        for (key, _), pts in grouped.items()
    ]
    if latest:
        newest: dict[str, Curve] = {}
        for curve in out:
            have = newest.get(curve.scope_key)
            if have is None or curve.points[0].when > have.points[0].when:
                newest[curve.scope_key] = curve
        out = list(newest.values())
    return sorted(out, key=lambda c: (c.scope_key, c.points[0].when))


# --- noise and flags --------------------------------------------------------------------------


@dataclass(frozen=True)
class Noise:
    low: float
    high: float
    source: str  # "stability" | "repeats n=<k>"

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self) -> str:
        return f"{self.low:.4g}..{self.high:.4g} ({self.source})"


def stability_noise(point: Point, metric: str) -> Noise | None:
    """The point's own range for the metric: its stability block's sub-window extremes (latency,
    interactivity), or for a throughput its value ± 2 standard errors over the same sub-windows."""
    rng = point.noise.get(metric)
    return Noise(rng[0], rng[1], point.noise_source.get(metric, "stability")) if rng else None


def repeat_noise(point: Point, metric: str, pool: Sequence[Point], leave_out: int) -> Noise | None:
    """The spread of the point's repeats: same identity and recipe, SUCCESS, the other side left out."""
    values = [
        q.metrics[metric]
        for q in pool
        if q.id != leave_out
        and q.status == "SUCCESS"
        and metric in q.metrics
        and q.recipe_fingerprint == point.recipe_fingerprint
        and q.identity == point.identity
    ]
    if len(values) < 2:
        return None
    return Noise(min(values), max(values), f"repeats n={len(values)}")


@dataclass(frozen=True)
class Change:
    metric: str
    base: float | None
    head: float | None
    flagged: bool | None  # None: no noise figure to judge by
    noise: str  # how it was judged

    @property
    def relative(self) -> float | None:
        if self.base is None or self.head is None or self.base == 0:
            return None
        return (self.head - self.base) / abs(self.base)

    @property
    def direction(self) -> str:
        """better / worse / "" (unflagged or a metric without a better direction)."""
        better = higher_is_better(self.metric)
        if not self.flagged or better is None or self.base is None or self.head is None:
            return ""
        return "better" if (self.head > self.base) == better else "worse"


def judge(base: Point, head: Point, metric: str, pool: Sequence[Point]) -> Change:
    """Whether head's value of ``metric`` differs from base's beyond their measured noise."""
    b, h = base.metrics.get(metric), head.metrics.get(metric)
    if b is None or h is None:
        return Change(metric, b, h, None, "no value" if b is None or h is None else "")
    nb = stability_noise(base, metric) or repeat_noise(base, metric, pool, leave_out=head.id)
    nh = stability_noise(head, metric)
    if nb is not None and nh is not None:
        flagged = nh.low > nb.high or nh.high < nb.low
        return Change(metric, b, h, flagged, f"base {nb.text()}, head {nh.text()}")
    if nb is not None:
        return Change(metric, b, h, not nb.holds(h), f"base {nb.text()}")
    if nh is not None:
        return Change(metric, b, h, not nh.holds(b), f"head {nh.text()}")
    return Change(metric, b, h, None, "no noise figure (no stability block, no repeated runs)")


# --- diff and history -------------------------------------------------------------------------


@dataclass
class Pair:
    base: Point | None
    head: Point | None
    changes: list[Change]

    @property
    def point(self) -> Point:
        found = self.head or self.base
        assert found is not None
        return found


def diff(
    base: Sequence[Point], head: Sequence[Point], metrics: Sequence[str], pool: Sequence[Point]
) -> list[Pair]:
    """Base and head points paired by identity (a point on one side only is listed alone)."""
    by_base = {p.identity: p for p in measured(base)}
    by_head = {p.identity: p for p in measured(head)}
    pairs = []
    for key in sorted(set(by_base) | set(by_head)):
        b, h = by_base.get(key), by_head.get(key)
        changes = [judge(b, h, metric, pool) for metric in metrics] if b and h else []
        pairs.append(Pair(b, h, changes))
    return pairs


@dataclass
class HistoryLine:
    """One measurement (identity) over the runs that hold it, oldest first."""

    identity: tuple[str, ...]
    points: list[Point]
    changes: list[Change | None]  # against the previous point; None for the first


def history(points: Sequence[Point], metric: str) -> list[HistoryLine]:
    by_identity: dict[tuple[str, ...], list[Point]] = defaultdict(list)
    for point in measured(points):
        by_identity[point.identity].append(point)
    lines = []
    for key, pts in sorted(by_identity.items()):
        pts.sort(key=lambda p: p.when)
        changes: list[Change | None] = [None]
        for prev, cur in itertools.pairwise(pts):
            earlier = [p for p in pts if p.when <= prev.when]
            changes.append(judge(prev, cur, metric, earlier))
        lines.append(HistoryLine(key, pts, changes))
    return lines
