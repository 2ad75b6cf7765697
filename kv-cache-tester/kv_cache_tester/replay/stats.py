"""Percentiles and a bounded log-bucket histogram (for inter-token latencies across a whole run)."""

from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p90", 90.0),
    ("p95", 95.0),
    ("p99", 99.0),
    ("p99.9", 99.9),
)


def pct(sorted_values: Sequence[float], q: float) -> float | None:
    """Percentile with linear interpolation between closest ranks (numpy's default)."""
    n = len(sorted_values)
    if n == 0:
        return None
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """{mean, p50, p90, p95, p99, p99.9}; every entry None when there are no samples."""
    data = sorted(values)
    out: dict[str, float | None] = {"mean": (math.fsum(data) / len(data)) if data else None}
    for name, q in PERCENTILES:
        out[name] = pct(data, q)
    return out


def itl_summary(itls: Sequence[float]) -> dict[str, float | int | None]:
    """The per-request ITL summary kept in requests.jsonl instead of the raw list."""
    if not itls:
        return {"mean": None, "p50": None, "p99": None, "max": None, "n": 0}
    data = sorted(itls)
    return {
        "mean": math.fsum(data) / len(data),
        "p50": pct(data, 50.0),
        "p99": pct(data, 99.0),
        "max": data[-1],
        "n": len(data),
    }


class LogHistogram:
    """Counts values in geometric buckets 1% wide: bounded memory whatever the run length.

    Values below ``floor`` (1 µs) share bucket 0 (zero gaps: events read together).
    """

    GROWTH = 1.01
    FLOOR = 1e-6

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.total = 0.0

    def _bucket(self, value: float) -> int:
        if value < self.FLOOR:
            return 0
        return 1 + int(math.log(value / self.FLOOR) / math.log(self.GROWTH))

    def _value(self, bucket: int) -> float:
        if bucket == 0:
            return 0.0
        # geometric middle of the bucket
        return self.FLOOR * self.GROWTH ** (bucket - 1) * math.sqrt(self.GROWTH)

    def add_many(self, values: Sequence[float]) -> None:
        counts = self.counts
        bucket = self._bucket
        for v in values:
            b = bucket(v)
            counts[b] = counts.get(b, 0) + 1
        self.n += len(values)
        self.total += math.fsum(values)

    def merge(self, other: dict) -> None:
        for b, c in other["counts"].items():
            b = int(b)
            self.counts[b] = self.counts.get(b, 0) + int(c)
        self.n += int(other["n"])
        self.total += float(other["total"])

    def to_dict(self) -> dict:
        return {"counts": self.counts, "n": self.n, "total": self.total}

    def quantile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        rank = q / 100.0 * (self.n - 1)
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen > rank:
                return self._value(b)
        return self._value(max(self.counts))

    def distribution(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {"mean": self.total / self.n if self.n else None}
        for name, q in PERCENTILES:
            out[name] = self.quantile(q)
        return out
