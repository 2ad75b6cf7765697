"""Every engine instance of a routed cell judged on its own: a frozen replica hidden by a healthy one.

The cell's own checks see the client's requests as a whole: one healthy replica keeps every window
second covered, and the lanes stuck on a frozen one are in flight (not idle) and fail only once each,
at the end. So each instance behind the router (``r<i>``, ``p<i>``, ``d<i>``) is judged from its own
scrapes (``server_metrics.<name>.csv``, one per scrape interval) over the profiling window:

- ``instance_metrics``: its scrapes are there, readable, at least two in the window, counters monotone;
- ``instance_coverage``: of the window time it had requests (running or waiting at both ends of a
  scrape interval), the share in which it made progress (prompt or generated tokens, or finished
  requests, went up); an instance that had no requests is not judged (the router's choice, shown by
  collect as ``router_busiest_share``);
- ``instance_stalls``: its longest stretch with requests and no progress, in the engine's clock;
- ``instance_scrape_gaps``: its longest time without an answered scrape (a frozen process answers
  nothing), in the engine's clock too: a sped-up simulated engine lives ``speed`` engine seconds per
  wall second, so 3.6 s of wall time without an answer is 180 engine seconds at 50x. It is judged
  against the stall limit, or against MIN_GAP_INTERVALS scrape intervals when those are longer (the
  scrapes then resolve no shorter stall, and the limit says so);
- ``instance_request_counts``: the requests the router sent it (``router_metrics.csv``) against the
  requests it finished (its ``requests_finished_total``), whole run: it may finish fewer by at most
  the requests the client saw fail, never more.

The reasons name the instance.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import ROUTER_METRICS_CSV, instance_metrics_csv
from agentsweep.contract.verdict import Check
from agentsweep.errors import ResultFileError
from agentsweep.metrics.scrapes import ScrapeReader

# Counters whose rise says an instance made progress.
PROGRESS = ("prompt_tokens_total", "generation_tokens_total", "requests_finished_total")
# A scrape gap is judged against this many scrape intervals at least: a scrape that times out (the
# scraper waits up to 2 intervals, at least 1 s) and the next one's delay are load, not a frozen engine.
MIN_GAP_INTERVALS = 3


@dataclass
class InstanceFacts:
    """One instance's scrapes over the window, reduced to what the checks need."""

    name: str
    problem: str = ""
    busy_s: float = 0.0  # window seconds with requests at both ends of a scrape interval
    covered_s: float = 0.0  # ... of which the instance made progress
    stall_s: float = 0.0  # longest run of busy intervals without progress (wall)
    gap_s: float = 0.0  # longest stretch of the window without a scrape (wall)
    interval_s: float = 1.0  # median scrape interval
    finished: float | None = None  # requests_finished_total, last minus first scrape
    times: list[float] = field(default_factory=list)


def _reading(path: Path) -> tuple[list[tuple[float, dict[str, float | None]]], str]:
    """(rows in time order, problem) of one instance's scrapes."""
    rows: list[tuple[float, dict[str, float | None]]] = []
    reader = ScrapeReader(path)
    try:
        for scrape in reader:
            if scrape.not_number is not None:
                column, text = scrape.not_number
                return [], f"{path.name}: {column}={text[:40]!r} is not a number"
            rows.append((scrape.time_s, scrape.values))
    except ResultFileError as err:
        return [], str(err)
    rows.sort(key=lambda row: row[0])
    for column in (*PROGRESS, "requests_running"):
        if column in reader.missing:
            return [], f"{path.name}: no {column} column"
    last: dict[str, float] = {}
    for _t, values in rows:
        for column in PROGRESS:
            value = values.get(column)
            if value is None:
                continue
            if value < last.get(column, value):
                return [], f"{path.name}: {column} goes down"
            last[column] = value
    return rows, ""


def _busy(values: dict[str, float | None]) -> bool:
    return (values.get("requests_running") or 0.0) + (values.get("requests_waiting") or 0.0) > 0


def _progressed(a: dict[str, float | None], b: dict[str, float | None]) -> bool:
    for column in PROGRESS:
        va, vb = a.get(column), b.get(column)
        if va is not None and vb is not None and vb > va:
            return True
    return False


def instance_facts(result_dir: Path, name: str, start: float, end: float) -> InstanceFacts:
    """What one instance's scrapes say over the window [start, end] (Unix seconds)."""
    facts = InstanceFacts(name)
    rows, problem = _reading(result_dir / instance_metrics_csv(name))
    if problem:
        facts.problem = problem
        return facts
    times = [t for t, _ in rows]
    facts.times = times
    inside = [t for t in times if start <= t <= end]
    if len(inside) < 2:
        facts.problem = f"{instance_metrics_csv(name)}: {len(inside)} scrape(s) in the profiling window"
        return facts
    firsts = [v.get("requests_finished_total") for _, v in rows]
    known = [v for v in firsts if v is not None]
    facts.finished = known[-1] - known[0] if len(known) >= 2 else None
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    facts.interval_s = statistics.median(gaps) if gaps else 1.0
    # The window's edges count as gaps when the scrapes do not reach them.
    facts.gap_s = max(0.0, inside[0] - start, end - inside[-1])
    run = 0.0
    for (a, va), (b, vb) in itertools.pairwise(rows):
        lo, hi = max(a, start), min(b, end)
        if hi <= lo:
            continue
        facts.gap_s = max(facts.gap_s, b - a)
        if not (_busy(va) and _busy(vb)):
            run = 0.0
            continue
        facts.busy_s += hi - lo
        if _progressed(va, vb):
            facts.covered_s += hi - lo
            run = 0.0
        else:
            run += hi - lo
            facts.stall_s = max(facts.stall_s, run)
    return facts


def _router_sent(result_dir: Path, names: list[str]) -> tuple[dict[str, float], str]:
    """Requests the router sent each instance over the run (last minus first scrape), or a problem."""
    reader = ScrapeReader(result_dir / ROUTER_METRICS_CSV, figures=None)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    try:
        for scrape in reader:
            for name in names:
                value = scrape.values.get(f"requests.{name}")
                if value is not None:
                    first.setdefault(name, value)
                    last[name] = value
    except ResultFileError as err:
        return {}, str(err)
    missing = [n for n in names if n not in last]
    if missing:
        return {}, f"{ROUTER_METRICS_CSV}: no requests counted for {', '.join(missing)}"
    return {n: last[n] - first[n] for n in names}, ""


def instance_checks(
    result_dir: Path, cell: Cell, start: float, end: float, client_failures: int, idle_limit_s: float
) -> dict[str, Check]:
    """The per-instance checks of a routed cell over the window [start, end] (Unix seconds).

    ``client_failures``: requests the client saw fail or abandoned, whole run (a finished-count
    shortfall an instance may have); ``idle_limit_s``: the longest stall allowed, engine clock.
    """
    names = cell.instance_names
    facts = [instance_facts(result_dir, name, start, end) for name in names]
    checks: dict[str, Check] = {}
    broken = [f"{f.name}: {f.problem}" for f in facts if f.problem]
    checks["instance_metrics"] = Check(
        float(len(broken)), 0.0, not broken, "; ".join(broken) + " (not judged on its own)" if broken else ""
    )
    judged = [f for f in facts if not f.problem]

    busy = [f for f in judged if f.busy_s > 0]
    if busy:
        worst = min(busy, key=lambda f: f.covered_s / f.busy_s)
        coverage = worst.covered_s / worst.busy_s
        limit = cell.limits.min_window_coverage
        checks["instance_coverage"] = Check(
            coverage,
            limit,
            coverage >= limit,
            f"{worst.name}: {worst.busy_s - worst.covered_s:.1f} of {worst.busy_s:.1f} window seconds with "
            f"requests produced no token (coverage {coverage:.1%}, limit {limit:.0%})",
        )

    if judged:
        staller = max(judged, key=lambda f: f.stall_s)
        stall = staller.stall_s * cell.speed
        checks["instance_stalls"] = Check(
            stall,
            idle_limit_s,
            stall <= idle_limit_s,
            f"{staller.name}: requests in flight and no progress for {stall:.1f} s (engine clock; "
            f"limit {idle_limit_s:g} s)",
        )

        # In the engine's clock, as the stall limit: time without an answer is time the instance may
        # have made no progress; the limit never below what the scrape interval can resolve.
        def gap_limit(f: InstanceFacts) -> float:
            return max(idle_limit_s, MIN_GAP_INTERVALS * f.interval_s * cell.speed)

        gapped = max(judged, key=lambda f: f.gap_s * cell.speed / gap_limit(f))
        gap, limit = gapped.gap_s * cell.speed, gap_limit(gapped)
        why = (
            "the stall limit"
            if limit == idle_limit_s
            else f"{MIN_GAP_INTERVALS} scrape intervals, the shortest stall the scrapes resolve (stall "
            f"limit {idle_limit_s:g} s)"
        )
        checks["instance_scrape_gaps"] = Check(
            gap,
            limit,
            gap <= limit,
            f"{gapped.name}: no scrape answered for {gap:.0f} s of the window (engine clock; "
            f"{gapped.gap_s:.1f} s wall, scrapes every {gapped.interval_s:.1f} s; limit {limit:.0f} s, {why}): "
            "the instance did not answer its /metrics",
        )

    counted = [f for f in judged if f.finished is not None]
    if counted:
        sent, problem = _router_sent(result_dir, [f.name for f in counted])
        if problem:
            checks["instance_request_counts"] = Check(None, None, True, note=f"not judged: {problem}")
        else:
            checks["instance_request_counts"] = _count_check(counted, sent, client_failures, cell)
    return checks


def _count_check(facts: list[InstanceFacts], sent: dict[str, float], failures: int, cell: Cell) -> Check:
    tolerance = cell.limits.max_request_count_gap
    worst: tuple[float, str] = (0.0, "")
    for f in facts:
        assert f.finished is not None
        routed = sent[f.name]
        slack = max(1.0, tolerance * routed)
        # A request the client gave up on may still finish on the instance while the cell lets the
        # engines' counts settle, where the router's count need not hold it (a router may count a
        # request when its answer is delivered): as many over as the client lost are allowed.
        over = f.finished - routed - failures
        short = routed - f.finished - failures
        if over > slack:
            gap = over / max(routed, 1.0)
            if gap > worst[0]:
                lost = f" and the client gave up on or saw fail only {failures}" if failures else ""
                worst = (
                    gap,
                    f"{f.name} finished {f.finished:.0f} requests but the router sent it {routed:.0f}{lost}",
                )
        elif short > slack:
            gap = short / max(routed, 1.0)
            if gap > worst[0]:
                worst = (
                    gap,
                    f"the router sent {f.name} {routed:.0f} requests, it finished {f.finished:.0f} and the "
                    f"client saw only {failures} fail",
                )
    return Check(worst[0], tolerance, not worst[1], worst[1])
