"""The answer a reader wants first: per hardware and model, the best configuration per SLO tier and
the frontier's throughput per GPU at stated interactivity levels, with the cells' verdict counts.

Computed once, here, from collect's two tables (summary.csv's rows and capacity.csv's), never in a
template: report.html, summary.md (and so the GitHub step summary) and the sweep's last lines render
the same ``Headline``. ``from_files`` reads it back from a collected folder.

What it says and how it says it honestly:

- a tier's best configuration is the capacity row (a capacity cell's search, or a series of ordinary
  cells read as a grid) with the most agents per GPU that meets the tier; "≥" where the largest count
  measured still meets it; how the figure was read (bracket, bootstrap interval, interpolated between
  cells) and how many runs each count had, so one run per count never reads as an interval;
- a tier no configuration meets says so, with what binds it;
- throughput per GPU at an interactivity level comes off the Pareto frontier of output tok/s/GPU
  against interactivity (1 / median full-response ITL) over every SUCCESS point of the group: a point
  at that level, else interpolated linearly between the two frontier points around it (and marked
  so), else the frontier's slowest point when every point is faster, and "not reached" past the
  fastest point: never extrapolated.
- where the rows carry a throughput's noise range (the store's points do: value ± 2 standard errors
  over the window's sub-windows), a level's figure carries the range read the same way, so two runs'
  figures at a level can be judged against their noise (the dashboard's baseline-versus-head view).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from kv_cache_tester.metrics import finite

from agentsweep.cell.record import plain_line
from agentsweep.collect.capacity import hardware_of
from agentsweep.collect.pareto import frontier
from agentsweep.collect.table import TableRow

INTERACTIVITY_LEVELS = (20.0, 50.0, 100.0)  # tok/s per user
INTERACTIVITY = "interactivity_p50_tok_per_s"
INTERACTIVITY_TEXT = "interactivity = 1 / median full-response ITL (tok/s per user)"
OUTPUT = "output_tok_per_s_per_gpu"
TOTAL = "total_tok_per_s_per_gpu"
# A row's (low, high) noise range of its output tok/s per GPU, where it has one.
OUTPUT_RANGE = "output_tok_per_s_per_gpu_range"
STATUS_ORDER = ("SUCCESS", "INVALID", "FAILED", "MALFORMED", "MISSING")
UNKNOWN = "unknown"


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _int_text(value: Any) -> str:
    number = finite(value)
    if number is None:
        return _text(value) or "?"
    return f"{number:,.0f}" if number.is_integer() else f"{number:g}"


def agents_text(value: float) -> str:
    """Agents per GPU: whole when whole, else one decimal."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _agents_unit(value: float | None) -> str:
    return "agent" if value == 1 else "agents"


def tok_text(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"


@dataclass(frozen=True)
class Configuration:
    """What a figure was measured on, as a reader names it: ``TP 2 · offload on`` (+ users)."""

    tp: str
    offload: str
    users: str = ""
    engine: str = ""  # shown when the group has more than one engine
    router: str = ""
    disagg: str = ""
    replicas: str = ""
    step: bool = False  # a capacity cell's step

    def text(self, with_users: bool = True) -> str:
        parts = [f"TP {self.tp}"]
        if self.replicas not in ("", "1"):
            parts.append(f"{self.replicas} replicas")
        if with_users and self.users:
            parts.append(f"{self.users} user" + ("" if self.users == "1" else "s"))
        parts.append(f"offload {self.offload}")
        if self.router:
            parts.append(f"router {self.router}")
        if self.disagg:
            parts.append(self.disagg)
        if self.engine:
            parts.append(self.engine)
        return " · ".join(parts) + (" (capacity step)" if self.step and with_users else "")


def configuration(row: TableRow, engines: bool) -> Configuration:
    return Configuration(
        tp=_int_text(row.get("tp")),
        offload=_text(row.get("offload")) or "?",
        users=_int_text(row.get("users")) if finite(row.get("users")) is not None else "",
        engine=_text(row.get("engine")) if engines else "",
        router=_text(row.get("router")),
        disagg=_text(row.get("disagg")),
        replicas=_int_text(row.get("replicas")) if finite(row.get("replicas")) is not None else "",
        step=bool(_text(row.get("step_of"))),
    )


@dataclass(frozen=True)
class TierPick:
    """One tier's answer for one hardware and model."""

    tier: str
    description: str  # interactive (TTFT p90 ≤ 10 s, speed p25 ≥ 20 tok/s)
    met: bool
    agents_per_gpu: float | None = None
    at_least: bool = False  # the largest count measured still meets it
    agents_per_mw: float | None = None
    configuration: str = ""
    binding: str = ""  # what ends it, with its value where measured
    reading: str = ""  # how the figure was read
    ties: int = 0  # other configurations with as many agents per GPU
    read: int = 0  # configurations read against the tier

    @property
    def agents(self) -> str:
        if self.agents_per_gpu is None:
            return "–"
        return ("≥ " if self.at_least else "") + agents_text(self.agents_per_gpu)

    @property
    def per_mw(self) -> str:
        if self.agents_per_mw is None:
            return "–"
        return ("≥ " if self.at_least else "") + f"{self.agents_per_mw:,.0f}"

    @property
    def bound(self) -> str:
        return self.binding if self.binding.startswith("nothing") else f"bound by {self.binding}"

    def line(self) -> str:
        if not self.met:
            return f"tier {self.description}: no configuration meets it ({self.binding})"
        mw = f", {self.per_mw} per MW" if self.agents_per_mw is not None else ""
        ties = f"; {self.ties} other configuration(s) as many" if self.ties else ""
        return (
            f"tier {self.description}: {self.agents} {_agents_unit(self.agents_per_gpu)} per GPU{mw} "
            f"with {self.configuration} "
            f"({self.reading}); {self.bound}{ties}"
        )


@dataclass(frozen=True)
class LevelPick:
    """Throughput per GPU at one interactivity level, off the group's frontier."""

    level: float
    kind: str  # measured | faster | interpolated | not reached | no points
    output: float | None = None
    total: float | None = None
    configuration: str = ""
    how: str = ""
    output_range: tuple[float, float] | None = None  # the output figure's noise range, read as it is

    @property
    def level_text(self) -> str:
        return f"{self.level:g} tok/s/user"

    def line(self) -> str:
        head = f"at {self.level_text}: "
        if self.output is None:
            return head + self.how
        total = f" ({tok_text(self.total)} total)" if self.total is not None else ""
        return f"{head}{tok_text(self.output)} output tok/s/GPU{total}, {self.configuration} ({self.how})"


@dataclass(frozen=True)
class GroupHeadline:
    hardware: str
    model: str
    cells: tuple[tuple[str, int], ...]  # (status, count) of the cells (capacity steps apart)
    steps: tuple[tuple[str, int], ...]  # (status, count) of capacity steps
    tiers: tuple[TierPick, ...]
    levels: tuple[LevelPick, ...]
    note: str = ""  # why no tier could be read, where none was

    @property
    def title(self) -> str:
        return f"{self.hardware or UNKNOWN} · {self.model or UNKNOWN}"

    @property
    def verdicts(self) -> str:
        total = sum(n for _s, n in self.cells)
        text = f"{total} cell(s): " + (", ".join(f"{n} {s}" for s, n in self.cells) or "none")
        if self.steps:
            count = sum(n for _s, n in self.steps)
            text += f"; and {count} capacity step(s): " + ", ".join(f"{n} {s}" for s, n in self.steps)
        return text


@dataclass(frozen=True)
class Headline:
    groups: tuple[GroupHeadline, ...]

    def lines(self) -> list[str]:
        """Plain lines (one screen) for a terminal: no control characters, whatever a cell held."""
        out: list[tuple[int, str]] = []  # (indent, text)
        for group in self.groups:
            out.append((0, f"{group.title}: {group.verdicts}"))
            if group.note:
                out.append((2, group.note))
            out += [(2, pick.line()) for pick in group.tiers]
            out.append((2, f"throughput per GPU on the frontier ({INTERACTIVITY_TEXT}):"))
            out += [(4, pick.line()) for pick in group.levels]
        return [" " * indent + plain_line(text) for indent, text in out]


def _counts(statuses: Iterable[str]) -> tuple[tuple[str, int], ...]:
    counter = Counter(statuses)
    order = [s for s in STATUS_ORDER if s in counter] + sorted(s for s in counter if s not in STATUS_ORDER)
    return tuple((s, counter[s]) for s in order)


def _is_step(row: TableRow) -> bool:
    return bool(_text(row.get("step_of")))


def _is_capacity(row: TableRow) -> bool:
    return bool(_text(row.get("capacity")))


def capacity_reading(row: TableRow) -> str:
    """How a capacity row's figure was read, and what backs it."""
    kind = _text(row.get("boundary_type"))
    low, high = finite(row.get("interval_low")), finite(row.get("interval_high"))
    repeats = finite(row.get("repeats"))
    if repeats is None or repeats < 1:
        runs = "runs per count not recorded"
    elif repeats == 1:
        runs = "one run per count, so no run-to-run spread"
    else:
        runs = f"at least {_int_text(repeats)} runs per count"
    if _text(row.get("source")) == "search":
        where = "capacity search"
        if kind == "cliff":
            where += " at a KV cliff"
        if kind == "at_least":
            return f"{where}: the highest count searched still meets it; {runs}"
        if kind == "unresolved":
            return f"{where} cut short ({_text(row.get('stop_reason'))}); {runs}"
        if low is not None and high is not None:
            if _text(row.get("interval_kind")) == "bootstrap":
                return f"{where}: interval {_int_text(low)}–{_int_text(high)} users from {runs}"
            if low == high:
                return f"{where}: passes at {_int_text(low)} users, fails at {_int_text(high + 1)}; {runs}"
            return f"{where}: bracketed {_int_text(low)}–{_int_text(high)} users; {runs}"
        return f"{where}; {runs}"
    if kind == "at_least":
        return f"grid: the largest count measured ({_int_text(row.get('boundary_users'))} users) meets it; {runs}"
    if kind == "exact":
        return f"grid: measured at {_int_text(low)} users, the next count fails; {runs}"
    if kind == "interpolated" and low is not None and high is not None:
        return f"grid: interpolated between the cells at {_int_text(low)} and {_int_text(high + 1)} users; {runs}"
    if kind == "bracketed" and low is not None and high is not None:
        return f"grid: between the cells at {_int_text(low)} and {_int_text(high + 1)} users; {runs}"
    return f"grid; {runs}"


def capacity_binding(row: TableRow) -> str:
    """What ends a capacity row's boundary: ``TTFT p90 (43 s at 6 users)``."""
    binding = _text(row.get("binding"))
    if not binding:
        return "nothing measured: no larger count was run"
    value = _text(row.get("binding_text"))
    users = finite(row.get("binding_users"))
    at = f" at {_int_text(users)} users" if users is not None else ""
    return binding + (f" ({value}{at})" if value else at)


def _met(row: TableRow) -> bool:
    users = finite(row.get("boundary_users"))
    return _text(row.get("boundary_type")) != "none" and users is not None and users > 0


def _tier_pick(tier: str, rows: list[TableRow], engines: bool) -> TierPick:
    description = _text(rows[0].get("description")) or tier
    met = [r for r in rows if _met(r) and finite(r.get("agents_per_gpu")) is not None]
    if not met:
        bindings = Counter(_text(r.get("binding")) or "not measured" for r in rows)
        top, n = bindings.most_common(1)[0]
        lowest = sorted({_int_text(r.get("binding_users")) for r in rows if finite(r.get("binding_users"))})
        at = f" at the lowest count measured ({', '.join(lowest)} users)" if lowest else ""
        return TierPick(
            tier, description, met=False, read=len(rows),
            binding=f"{len(rows)} configuration(s) read, none meets it{at}; bound by {top} in {n} of {len(rows)}",
        )  # fmt: skip

    def key(r: TableRow) -> tuple[float, float]:
        return (finite(r.get("agents_per_gpu")) or 0.0, finite(r.get(OUTPUT)) or 0.0)

    best = max(met, key=key)
    agents = finite(best.get("agents_per_gpu"))
    ties = sum(1 for r in met if r is not best and finite(r.get("agents_per_gpu")) == agents)
    return TierPick(
        tier,
        description,
        met=True,
        agents_per_gpu=agents,
        at_least=_text(best.get("boundary_type")) in ("at_least", "unresolved"),
        agents_per_mw=finite(best.get("agents_per_mw")),
        configuration=configuration({**best, "users": None}, engines).text(with_users=False),
        binding=capacity_binding(best),
        reading=capacity_reading(best),
        ties=ties,
        read=len(rows),
    )


def _level_pick(level: float, points: list[TableRow], engines: bool) -> LevelPick:
    xy = [(finite(p.get(INTERACTIVITY)), finite(p.get(OUTPUT))) for p in points]
    usable = [(i, x, y) for i, (x, y) in enumerate(xy) if x is not None and y is not None]
    if not usable:
        return LevelPick(level, "no points", how="no SUCCESS point has both figures")
    front = frontier([(x, y) for _i, x, y in usable], minimize_x=False)  # sorted by x, y falling
    chain = [points[usable[k][0]] for k in front]
    xs = [usable[k][1] for k in front]
    ys = [usable[k][2] for k in front]

    def label(p: TableRow) -> str:
        return configuration(p, engines).text()

    def total(p: TableRow) -> float | None:
        return finite(p.get(TOTAL))

    def noise(p: TableRow) -> tuple[float, float] | None:
        found = p.get(OUTPUT_RANGE)
        if not isinstance(found, tuple | list) or len(found) != 2:
            return None
        low, high = finite(found[0]), finite(found[1])
        return (low, high) if low is not None and high is not None else None

    if xs[-1] < level and not math.isclose(xs[-1], level, rel_tol=1e-9):
        return LevelPick(
            level, "not reached",
            how=f"not reached: the frontier's fastest point gives {xs[-1]:.1f} tok/s/user ({label(chain[-1])})",
        )  # fmt: skip
    j = next(k for k, x in enumerate(xs) if x >= level or math.isclose(x, level, rel_tol=1e-9))
    if math.isclose(xs[j], level, rel_tol=1e-9):
        return LevelPick(
            level, "measured", ys[j], total(chain[j]), label(chain[j]), "measured at this level", noise(chain[j])
        )  # fmt: skip
    if j == 0:
        return LevelPick(
            level, "faster", ys[0], total(chain[0]), label(chain[0]),
            f"measured at {xs[0]:.1f} tok/s/user: every frontier point is faster than this level",
            noise(chain[0]),
        )  # fmt: skip
    share = (level - xs[j - 1]) / (xs[j] - xs[j - 1])
    y = ys[j - 1] + share * (ys[j] - ys[j - 1])
    t0, t1 = total(chain[j - 1]), total(chain[j])
    t = t0 + share * (t1 - t0) if t0 is not None and t1 is not None else None
    r0, r1 = noise(chain[j - 1]), noise(chain[j])
    band = None
    if r0 is not None and r1 is not None:  # each end of the range read between the two as the figure is
        band = (r0[0] + share * (r1[0] - r0[0]), r0[1] + share * (r1[1] - r0[1]))
    return LevelPick(
        level, "interpolated", y, t,
        f"between {label(chain[j - 1])} and {label(chain[j])}",
        f"interpolated between {xs[j - 1]:.1f} and {xs[j]:.1f} tok/s/user",
        band,
    )  # fmt: skip


def _group_key(row: TableRow) -> tuple[str, str]:
    return (hardware_of(row), _text(row.get("model")))


def headline(df: pd.DataFrame, capacity: pd.DataFrame | None) -> Headline:
    """The headline of a collected sweep from its summary table and its capacity table."""
    rows = df.to_dict("records") if not df.empty else []
    cap_rows = capacity.to_dict("records") if capacity is not None and not capacity.empty else []
    order: list[tuple[str, str]] = []
    for row in rows:
        key = _group_key(row)
        if key not in order:
            order.append(key)
    groups = []
    for key in order:
        members = [r for r in rows if _group_key(r) == key]
        engines = len({_text(r.get("engine")) for r in members}) > 1
        points = [r for r in members if r.get("status") == "SUCCESS" and not _is_capacity(r)]
        mine = [r for r in cap_rows if (_text(r.get("hardware")), _text(r.get("model"))) == key]
        tiers: dict[str, list[TableRow]] = {}
        for r in mine:
            tiers.setdefault(_text(r.get("tier")), []).append(r)
        note = ""
        if not tiers:
            note = (
                "no SLO tier read: no capacity cell, and no SUCCESS or INVALID series of ordinary cells "
                "to read a grid from"
            )
        groups.append(
            GroupHeadline(
                hardware=key[0],
                model=key[1],
                cells=_counts(_text(r.get("status")) for r in members if not _is_step(r)),
                steps=_counts(_text(r.get("status")) for r in members if _is_step(r)),
                tiers=tuple(_tier_pick(t, found, engines) for t, found in tiers.items()),
                levels=tuple(_level_pick(level, points, engines) for level in INTERACTIVITY_LEVELS),
                note=note,
            )
        )
    return Headline(tuple(groups))


def from_files(aggregated: Path) -> Headline | None:
    """The headline of a collected folder (summary.csv and capacity.csv), None when it has none."""
    summary = aggregated / "summary.csv"
    if not summary.is_file():
        return None
    df = pd.read_csv(summary, low_memory=False)
    capacity_csv = aggregated / "capacity.csv"
    capacity = pd.read_csv(capacity_csv) if capacity_csv.is_file() else None
    return headline(df, capacity)
