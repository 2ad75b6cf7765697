"""Percentiles and a bounded log-bucket histogram: the one statistics module.

Used by the replayer (summary.json), the trace analysis, collect (requests.jsonl recount) and the
experimental clients. One convention everywhere: a percentile ``p`` is given on the 0-100 scale
(p50, p99.9), never as a 0-1 fraction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NotRequired, TypedDict

# The summary's per-metric statistics. "p99.9" is not an identifier, hence the functional form.
Distribution = TypedDict(
    "Distribution",
    {
        "mean": float | None,
        "p50": float | None,
        "p90": float | None,
        "p95": float | None,
        "p99": float | None,
        "p99.9": float | None,
        "p75": NotRequired[float | None],  # in summaries written with the steady window
        "std": NotRequired[float | None],
    },
)


class HistogramState(TypedDict):
    """A LogHistogram as plain data (crosses process boundaries and merges)."""

    counts: dict[int, int]
    n: int
    total: float


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Percentile ``p`` (0-100) of already sorted values, with linear interpolation between the
    closest ranks (numpy's default); None when there are none."""
    n = len(sorted_values)
    if n == 0:
        return None
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def distribution(values: Iterable[float]) -> Distribution:
    """{mean, p50, p90, p95, p99, p99.9}; every entry None when there are no samples."""
    data = sorted(values)
    return {
        "mean": (math.fsum(data) / len(data)) if data else None,
        "p50": percentile(data, 50.0),
        "p90": percentile(data, 90.0),
        "p95": percentile(data, 95.0),
        "p99": percentile(data, 99.0),
        "p99.9": percentile(data, 99.9),
    }


class LogHistogram:
    """Counts values in geometric buckets 1 % wide: bounded memory whatever the run length, and
    percentiles within 1 % of the exact ones.

    Values below ``floor`` share bucket 0 and read back as 0.0 (for inter-token gaps, below 1 µs
    means events read together). Bucket ``b`` >= 1 holds [floor * 1.01**(b-1), floor * 1.01**b) and
    reads back as its geometric middle.
    """

    GROWTH = 1.01
    FLOOR = 1e-6

    __slots__ = ("_log_growth", "counts", "floor", "n", "total")

    def __init__(self, floor: float = FLOOR) -> None:
        self.floor = floor
        self._log_growth = math.log(self.GROWTH)
        self.counts: dict[int, int] = {}
        self.n = 0
        self.total = 0.0

    def _bucket(self, value: float) -> int:
        if value < self.floor:
            return 0
        return 1 + int(math.log(value / self.floor) / self._log_growth)

    def _value(self, bucket: int) -> float:
        if bucket == 0:
            return 0.0
        return self.floor * self.GROWTH ** (bucket - 1) * math.sqrt(self.GROWTH)

    def add(self, value: float) -> None:
        b = self._bucket(value)
        self.counts[b] = self.counts.get(b, 0) + 1
        self.n += 1
        self.total += value

    def add_count(self, value: float, count: int) -> None:
        """``add`` of ``value``, ``count`` times."""
        if count > 0:
            b = self._bucket(value)
            self.counts[b] = self.counts.get(b, 0) + count
            self.n += count
            self.total += value * count

    def add_many(self, values: Sequence[float]) -> None:
        """``add`` for each value (the bucket arithmetic inlined: collect feeds millions of values)."""
        counts = self.counts
        floor, log_growth, log = self.floor, self._log_growth, math.log
        for v in values:  # _bucket, inline: this runs for every token of every request
            b = 0 if v < floor else 1 + int(log(v / floor) / log_growth)
            counts[b] = counts.get(b, 0) + 1
        self.n += len(values)
        self.total += math.fsum(values)

    def merge(self, other: HistogramState) -> None:
        """Add another histogram's state (``to_dict``; bucket keys may arrive as strings from JSON)."""
        for b, c in other["counts"].items():
            key = int(b)
            self.counts[key] = self.counts.get(key, 0) + int(c)
        self.n += int(other["n"])
        self.total += float(other["total"])

    def to_dict(self) -> HistogramState:
        return {"counts": self.counts, "n": self.n, "total": self.total}

    def mean(self) -> float | None:
        return self.total / self.n if self.n else None

    def percentile(self, p: float) -> float | None:
        """Percentile ``p`` (0-100) as the middle of its bucket; None when empty."""
        if self.n == 0:
            return None
        rank = p / 100.0 * (self.n - 1)
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen > rank:
                return self._value(b)
        return self._value(max(self.counts))

    def distribution(self) -> Distribution:
        return {
            "mean": self.mean(),
            "p50": self.percentile(50.0),
            "p90": self.percentile(90.0),
            "p95": self.percentile(95.0),
            "p99": self.percentile(99.0),
            "p99.9": self.percentile(99.9),
        }
