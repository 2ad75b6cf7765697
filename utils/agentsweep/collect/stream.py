"""Stream a cell's requests.jsonl in constant memory: counts, token sums and latency percentiles.

Percentiles come from the log-spaced histogram of kv_cache_tester.stats (1 % relative bins above
0.1 ms), so a million-record file costs the same memory as a ten-record one. Records come through
the replayer's own reader (kv_cache_tester.replay.RecordReader) with no key required: a line that is
no record is counted, and a value of the wrong type reads as absent, so one odd line never hides a
whole cell.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kv_cache_tester.replay import RecordReader, RequestRecord, accepted
from kv_cache_tester.stats import LogHistogram

from agentsweep.contract.figures import Figures


def _histogram() -> LogHistogram:
    # A floor of 0.1 ms: request latencies below it are not told apart.
    return LogHistogram(floor=1e-4)


@dataclass
class RequestStats:
    records: int = 0
    bad_lines: int = 0
    warmup: int = 0
    profile_ok: int = 0
    profile_errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    theoretical_hit_blocks: int = 0
    total_blocks: int = 0
    first_bad_line: int | None = None
    # Records whose values cannot be true (cached > prompt, a negative count or latency).
    impossible: int = 0
    first_impossible: str = ""
    # Per lane: the largest context (prompt + output tokens) one of its profiled requests held.
    lane_peak: dict[int, int] = field(default_factory=dict)
    ttft: LogHistogram = field(default_factory=_histogram)
    e2e: LogHistogram = field(default_factory=_histogram)
    tpot: LogHistogram = field(default_factory=_histogram)

    def as_columns(self) -> Figures:
        out: Figures = {
            "req_records": self.records,
            "req_bad_lines": self.bad_lines,
            "req_warmup": self.warmup,
            "req_profile_ok": self.profile_ok,
            "req_profile_errors": self.profile_errors,
            "req_prompt_tokens": self.prompt_tokens,
            "req_cached_tokens": self.cached_tokens,
            "req_output_tokens": self.output_tokens,
            # Definitions: docs/collect.md, "Hit rates".
            "req_theoretical_hit_rate": (
                self.theoretical_hit_blocks / self.total_blocks if self.total_blocks else None
            ),
            "req_client_hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None,
        }
        for name, hist in (("ttft", self.ttft), ("e2e", self.e2e), ("tpot", self.tpot)):
            for q in (50, 90, 99):
                out[f"req_{name}_p{q}_s"] = hist.percentile(q)
        return out


def _count(value: int | None) -> int:
    """A token or block count as summed here: absent and negative (impossible) count as none."""
    return value if value is not None and value > 0 else 0


def _impossible(rec: RequestRecord) -> str:
    """What in a record cannot be true, or an empty string."""
    for key in ("prompt_tokens", "cached_tokens", "output_tokens", "ttft_s", "e2e_s", "tpot_s"):
        value = rec.get(key)
        if isinstance(value, int | float) and value < 0:
            return f"{key} {value:g} is negative"
    prompt, cached = rec.get("prompt_tokens"), rec.get("cached_tokens")
    if prompt is not None and cached is not None and cached > prompt:
        return f"cached_tokens {cached:g} > prompt_tokens {prompt:g}"
    return ""


# Latencies are handed to the histograms in batches of this many (a list each, bounded).
BATCH = 1 << 16


def stream_requests(path: Path, observe: Callable[[RequestRecord], None] | None = None) -> RequestStats:
    """Read requests.jsonl line by line. Undecodable lines are counted, never fatal (a file that
    cannot be opened is kv_cache_tester's ResultError). ``observe`` sees every record read.

    The loop keeps its counts in locals and hands latencies to the histograms in batches: it runs
    once per record of files with millions of them.
    """
    stats = RequestStats()
    reader = RecordReader(path, required=())
    records = warmup = profile_ok = profile_errors = 0
    prompt_sum = cached_sum = output_sum = hit_blocks = total_blocks = 0
    lane_peak = stats.lane_peak
    batches: tuple[list[float], list[float], list[float]] = ([], [], [])
    ttfts, e2es, tpots = batches
    for lineno, rec in reader.numbered():
        if observe is not None:
            observe(rec)
        records += 1
        get = cast(dict[str, Any], rec).get  # every value present has its declared type
        prompt, cached, output = get("prompt_tokens"), get("cached_tokens"), get("output_tokens")
        ttft, e2e, tpot = get("ttft_s"), get("e2e_s"), get("tpot_s")
        if (
            (prompt is not None and prompt < 0)
            or (cached is not None and (cached < 0 or (prompt is not None and cached > prompt)))
            or (output is not None and output < 0)
            or (ttft is not None and ttft < 0)
            or (e2e is not None and e2e < 0)
            or (tpot is not None and tpot < 0)
        ):
            stats.impossible += 1
            stats.first_impossible = stats.first_impossible or f"line {lineno}: {_impossible(rec)}"
        if get("phase") == "warmup":
            warmup += 1
            continue
        # Blocks count for every request the server accepted (its prefill happened), as in the
        # replayer's summary.
        if accepted(rec):
            hit_blocks += _count(get("theoretical_hit_blocks"))
            total_blocks += _count(get("total_blocks"))
        if get("status") != "ok":
            profile_errors += 1
            continue
        profile_ok += 1
        prompt = prompt if prompt is not None and prompt > 0 else 0
        output = output if output is not None and output > 0 else 0
        prompt_sum += prompt
        cached_sum += cached if cached is not None and cached > 0 else 0
        output_sum += output
        user = get("user")
        if user is not None:
            context = prompt + output
            if context > lane_peak.get(user, -1):
                lane_peak[user] = context
        if ttft is not None and ttft >= 0:
            ttfts.append(ttft)
        if e2e is not None and e2e >= 0:
            e2es.append(e2e)
        if tpot is not None and tpot >= 0:
            tpots.append(tpot)
        if len(ttfts) >= BATCH or len(e2es) >= BATCH or len(tpots) >= BATCH:
            _flush(batches, stats)
    _flush(batches, stats)
    stats.records, stats.warmup = records, warmup
    stats.profile_ok, stats.profile_errors = profile_ok, profile_errors
    stats.prompt_tokens, stats.cached_tokens, stats.output_tokens = prompt_sum, cached_sum, output_sum
    stats.theoretical_hit_blocks, stats.total_blocks = hit_blocks, total_blocks
    stats.bad_lines = reader.bad_lines
    stats.first_bad_line = reader.first_bad_line
    return stats


def _flush(batches: tuple[list[float], list[float], list[float]], stats: RequestStats) -> None:
    for values, hist in zip(batches, (stats.ttft, stats.e2e, stats.tpot), strict=True):
        hist.add_many(values)
        values.clear()
