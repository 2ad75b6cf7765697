"""Server-side figures of one cell over the replayer's profiling window only.

Counters are read at the window's start and end by linear interpolation between the neighbouring
scrapes (time_s is Unix time, as is the replayer's window), so warmup traffic before the window and
the drain after it never count. A counter that goes down (engine restart) gives no figure. When the
scrapes do not reach both edges of the window (the scraper started late or died), the figures are
over the part they cover (rates divide by that part, not the whole window) and a note says so;
scrapes that miss the window entirely give no counter figures.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import pairwise
from pathlib import Path

from agentsweep.contract.columns import SERVER
from agentsweep.contract.figures import Figures
from agentsweep.errors import ResultFileError
from agentsweep.metrics.dialects import COLUMNS
from agentsweep.metrics.scrapes import ScrapeReader

# The scraper's cumulative counters (its other columns are time_s and gauges).
COUNTERS = tuple(c for c in COLUMNS if c.endswith("_total"))
SERVER_COLUMNS = tuple(column.name for column in SERVER)


# Scrapes start before the window and end after it; only a shortfall beyond this is reported.
COVERAGE_SLACK_S = 1.0


class Series:
    """(time, value) points of one column, time-sorted, gaps (empty cells) dropped."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.v: list[float] = []

    def at(self, when: float) -> float | None:
        """Value at ``when``: interpolated between neighbours, else the nearest point."""
        if not self.t:
            return None
        hi = bisect_left(self.t, when)
        if hi < len(self.t) and self.t[hi] == when:
            return self.v[hi]
        if hi == 0:
            return self.v[0]
        if hi == len(self.t):
            return self.v[-1]
        t0, t1, v0, v1 = self.t[hi - 1], self.t[hi], self.v[hi - 1], self.v[hi]
        return v0 + (v1 - v0) * (when - t0) / (t1 - t0)

    def decreases(self, start: float, end: float) -> bool:
        """True when the series goes down anywhere between the points that bracket [start, end]."""
        lo = max(bisect_right(self.t, start) - 1, 0)
        hi = min(bisect_left(self.t, end) + 1, len(self.t))
        return any(b < a for a, b in pairwise(self.v[lo:hi]))

    def inside(self, start: float, end: float) -> list[float]:
        return self.v[bisect_left(self.t, start) : bisect_right(self.t, end)]


class NotNumbers(ValueError):
    """server_metrics.csv holds text where the scraper writes numbers: its figures cannot be used."""


def read_series(path: Path) -> tuple[dict[str, Series], list[float], list[str]]:
    """Series per column, every row's time, and notes on what was wrong with the file.

    Raises NotNumbers when a cell of a known column holds something other than a number (an empty
    cell is a figure the engine did not report, and is fine). A file that cannot be read as scrapes
    (no time_s column, say) gives no series and a note saying why.
    """
    series = {name: Series() for name in COLUMNS[1:]}
    times: list[float] = []
    reader = ScrapeReader(path)
    try:
        rows = sorted(reader, key=lambda scrape: scrape.time_s)
    except ResultFileError as err:
        return series, times, [str(err)]
    notes = [f"{path.name}: missing columns {', '.join(reader.missing)}"] if reader.missing else []
    for scrape in rows:
        times.append(scrape.time_s)
        if scrape.not_number is not None:
            name, text = scrape.not_number
            raise NotNumbers(
                f"{path.name}: {name}={text[:40]!r} at time_s {scrape.time_s:.3f} is not a number"
            )
        for name, value in scrape.values.items():
            if value is not None:
                series[name].t.append(scrape.time_s)
                series[name].v.append(value)
    if reader.bad_rows:
        notes.append(f"{path.name}: {reader.bad_rows} unreadable rows skipped")
    return series, times, notes


# cpu_tier_hit_source: where the lookups the CPU tier's hits are divided by come from.
READ_FROM_ENGINE = "engine"  # the engine's count of tokens looked up in its CPU tier
INFERRED = "inferred"  # the GPU's misses (prefix-cache queries minus GPU hits), each taken as a lookup


def cpu_tier_figures(delta: dict[str, float | None]) -> Figures:
    """The CPU tier's own hit rate over the window: its hits over the tokens looked up in it, as the
    engine counts them when it does, else over the GPU's misses (every token the GPU did not hold is
    taken to be looked up in the CPU tier)."""
    hits, lookups = delta["cpu_cache_hits_total"], delta["cpu_cache_queries_total"]
    if hits is None:
        return {}
    if lookups is not None:
        return {
            "cpu_tier_hit_rate": hits / lookups if lookups else None,
            "cpu_tier_hit_source": READ_FROM_ENGINE,
        }
    queries, gpu_hits = delta["prefix_cache_queries_total"], delta["prefix_cache_hits_total"]
    if queries is None or gpu_hits is None or queries - gpu_hits <= 0:
        return {}
    return {"cpu_tier_hit_rate": hits / (queries - gpu_hits), "cpu_tier_hit_source": INFERRED}


def window_figures(path: Path, start: float, end: float) -> tuple[Figures, list[str]]:
    """SERVER_COLUMNS for the window [start, end] (Unix seconds), plus notes."""
    out: Figures = dict.fromkeys(SERVER_COLUMNS)
    series, times, notes = read_series(path)
    inside_times = [t for t in times if start <= t <= end]
    out["server_rows_in_window"] = len(inside_times)
    if not inside_times and not any(s.t for s in series.values()):
        notes.append(f"{path.name}: no scrapes")
        return out, notes
    edges = [start, *inside_times, end]
    out["server_max_gap_s"] = max(b - a for a, b in pairwise(edges))
    if not inside_times:
        notes.append(f"{path.name}: no scrape inside the profiling window")

    delta: dict[str, float | None] = {}
    span: dict[str, float] = {}  # seconds of the window each counter's scrapes cover
    short: list[str] = []
    for name in COUNTERS:
        s = series[name]
        v0, v1 = s.at(start), s.at(end)
        if s.t:
            span[name] = min(end, s.t[-1]) - max(start, s.t[0])
            if span[name] < end - start - COVERAGE_SLACK_S:
                short.append(name)
        if v0 is None or v1 is None or span.get(name, 0.0) <= 0 < end - start:
            delta[name] = None
        elif v1 < v0 or s.decreases(start, end):
            delta[name] = None
            notes.append(f"{path.name}: {name} went down in the window (engine restarted?)")
        else:
            delta[name] = v1 - v0
    queries = delta["prefix_cache_queries_total"]
    if queries:
        for column, counter in (
            ("gpu_hit_rate", "prefix_cache_hits_total"),
            ("cpu_hit_rate", "cpu_cache_hits_total"),
        ):
            hits = delta[counter]
            out[column] = hits / queries if hits is not None else None
    out.update(cpu_tier_figures(delta))
    out["preemptions"] = delta["preemptions_total"]
    out["offload_bytes_gpu_to_cpu"] = delta["offload_bytes_gpu_to_cpu_total"]
    out["offload_bytes_cpu_to_gpu"] = delta["offload_bytes_cpu_to_gpu_total"]
    if short:
        covered = min(span[name] for name in short)
        notes.append(
            f"{path.name}: scrapes cover only {max(covered, 0.0):.1f} s of the {end - start:.1f} s window; "
            "server figures are over the covered part"
        )
    for column, counter in (
        ("server_prompt_tok_per_s", "prompt_tokens_total"),
        ("server_generation_tok_per_s", "generation_tokens_total"),
    ):
        # Over the seconds the scrapes cover: a counter frozen at its last scrape (scraper gone)
        # divided by the whole window would understate the rate.
        grown = delta[counter]
        if grown is not None and span.get(counter, 0.0) > 0:
            out[column] = grown / span[counter]

    for prefix, name in (("kv_usage", "kv_cache_usage"), ("cpu_kv_usage", "cpu_kv_cache_usage")):
        values = series[name].inside(start, end)
        if values:
            out[f"{prefix}_peak"] = max(values)
            out[f"{prefix}_mean"] = sum(values) / len(values)
    running = series["requests_running"].inside(start, end)
    if running:
        out["requests_running_mean"] = sum(running) / len(running)
    waiting = series["requests_waiting"].inside(start, end)
    if waiting:
        out["requests_waiting_peak"] = max(waiting)
    return out, notes
