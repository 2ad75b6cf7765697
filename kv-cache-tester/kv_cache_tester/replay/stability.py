"""The stability block of one point (InferenceX's keys; docs/metrics.md).

The steady window is cut into non-overlapping sub-windows of ``SUBWINDOW_S`` seconds, or of a third of
the window when that is shorter (a short run still has three), and as many whole sub-windows as fit
are expected. A sub-window is observed when at least one successful profile request finished in it.
Per observed sub-window: p75 and p90 of TTFT and E2E of the requests that finished in it, and
interactivity at p75 and p90 (``1 / pXX`` of their full-response ITL); the block holds the smallest and
largest of each across sub-windows. Root trajectories are the distinct traces started (a trace played
again with new content is another one), weighted by the requests of each that finished in the window:
their Kish effective count ``(sum w)^2 / sum w^2`` and the largest one's share ``max w / sum w`` say
whether a few long traces dominate the point.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

from kv_cache_tester.metrics import interactivity_at, record_full_response_itl_s
from kv_cache_tester.replay.results import RequestRecord, Stability
from kv_cache_tester.stats import percentile

SUBWINDOW_S = 600.0
MIN_SUBWINDOWS = 3
STATS = ("p75", "p90")
# (block key, how one record gives it); interactivity is 1 / percentile of the ITLs.
LATENCIES = (("ttft", "ttft_s"), ("e2el", "e2e_s"))


def subwindow_length(duration: float, subwindow_s: float = SUBWINDOW_S) -> float:
    """The sub-window length for a window of ``duration`` seconds."""
    return min(subwindow_s, duration / MIN_SUBWINDOWS)


def trajectory(record: RequestRecord) -> tuple[str, str]:
    """The root trajectory a request belongs to: its trace, and the content salt of the play."""
    return record["trace_id"], record.get("salt") or ""


def _times(group: Sequence[RequestRecord], field: str) -> list[float]:
    """The sorted values of a latency field over a group of records."""
    get = cast(Callable[[RequestRecord], Any], lambda r: r.get(field))
    return sorted(t for r in group if isinstance(t := get(r), int | float))


def stability_block(
    ok_in_window: Sequence[RequestRecord], start: float, stop: float, subwindow_s: float = SUBWINDOW_S
) -> Stability:
    """The block for the successful profile requests that finished in [start, stop] (run-start s)."""
    duration = stop - start
    length = subwindow_length(duration, subwindow_s) if duration > 0 else 0.0
    expected = int(duration / length + 1e-9) if length > 0 else 0
    groups: list[list[RequestRecord]] = [[] for _ in range(expected)]
    for r in ok_in_window:
        if expected:
            groups[min(expected - 1, int((r["t_done"] - start) / length))].append(r)
    observed = [g for g in groups if g]
    block: dict[str, Any] = {
        "subwindow_s": length,
        "expected_window_count": expected,
        "observed_window_count": len(observed),
    }
    for stat in STATS:
        p = float(stat[1:])
        for key, field in LATENCIES:
            values = [v for g in observed if (v := percentile(_times(g, field), p)) is not None]
            block[f"observed_window_{stat}_{key}_min"] = min(values, default=None)
            block[f"observed_window_{stat}_{key}_max"] = max(values, default=None)
        speeds = [
            v
            for g in observed
            if (v := interactivity_at((i for r in g if (i := record_full_response_itl_s(r)) is not None), p))
            is not None
        ]
        block[f"observed_window_{stat}_intvty_min"] = min(speeds, default=None)
        block[f"observed_window_{stat}_intvty_max"] = max(speeds, default=None)
    weights = Counter(trajectory(r) for r in ok_in_window)
    total = sum(weights.values())
    squares = math.fsum(w * w for w in weights.values())
    block["root_trajectory_count"] = len(weights)
    block["root_trajectory_kish_effective_count"] = total * total / squares if squares else None
    block["root_trajectory_largest_share"] = max(weights.values()) / total if total else None
    return cast(Stability, block)
