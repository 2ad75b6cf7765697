"""summary.json, computed from requests.jsonl (the one source of truth) plus the run's own facts.

Definitions (docs/replayer.md repeats them):
- window: starts when the last warmup request finished (the run start when there is none), ends
  when dispatching stopped (duration reached, signal, circuit breaker, or traces exhausted).
- counts and latency percentiles: every profile-phase request (a request dispatched before the
  window start by a lane whose warmup was over is profile too); warmup requests only in
  counts.warmup.
- throughput and goodput: profile requests that finished successfully inside the window, divided
  by the window duration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kv_cache_tester.replay.results import (
    SCHEMA_VERSION,
    RequestRecord,
    Summary,
    accepted,
    read_records,
    write_summary,
)
from kv_cache_tester.stats import HistogramState, LogHistogram, distribution, percentile


@dataclass(slots=True)
class RunMeta:
    """What the summary needs beyond requests.jsonl (one per process; merged across workers)."""

    t0_unix: float
    stop_rel: float  # dispatching stopped, seconds after t0
    end_rel: float  # last request finished or abandoned
    reason: str  # duration | signal | breaker | exhausted
    first_dispatch: list[float]  # per lane that dispatched, seconds after t0
    abandoned: int
    idle_lanes: int
    cpu_s: float
    wall_s: float
    itl_hist: HistogramState
    breaker: str | None = None
    signum: int | None = None
    errors: list[str] = field(default_factory=list)  # lanes or sub-agents that raised
    planned: int = 0  # requests in the plays that were started, from their start point
    sent: int = 0  # requests dispatched (each has a line in requests.jsonl)


def _rate(num: float, dur: float) -> float | None:
    return num / dur if dur > 0 else None


def build_summary(
    records_path: Path,
    metas: list[RunMeta],
    *,
    users: int,
    options: dict[str, Any],
    slo_ttft: float | None,
    slo_tpot: float | None,
) -> Summary:
    records = (
        read_records(records_path, required=RequestRecord.__required_keys__) if records_path.exists() else []
    )
    t0_unix = min(m.t0_unix for m in metas)
    stop_rel = max(m.stop_rel for m in metas)
    warm = [r for r in records if r.get("phase") == "warmup"]
    prof = [r for r in records if r.get("phase") != "warmup"]
    w_start = max((r["t_done"] for r in warm), default=0.0)
    w_start = min(w_start, stop_rel)
    duration = stop_rel - w_start

    ok = [r for r in prof if r["status"] == "ok"]
    failed = [r for r in prof if r["status"] != "ok"]
    by_class: dict[str, int] = {}
    for r in failed:
        error = r.get("error")
        cls = (error.get("class") if error else None) or "unknown"
        by_class[cls] = by_class.get(cls, 0) + 1

    in_win = [r for r in ok if w_start <= r["t_done"] <= stop_rel]
    in_tok = sum(r["prompt_tokens"] or 0 for r in in_win)
    out_tok = sum(r["output_tokens"] or 0 for r in in_win)

    def meets(r: RequestRecord) -> bool:
        if slo_ttft is not None and (r["ttft_s"] is None or r["ttft_s"] > slo_ttft):
            return False
        return not (slo_tpot is not None and r["tpot_s"] is not None and r["tpot_s"] > slo_tpot)

    good = [r for r in in_win if meets(r)]
    judged = [r for r in prof if w_start <= r["t_done"] <= stop_rel]

    tpots = [r["tpot_s"] for r in ok if r["tpot_s"] is not None]
    hist = LogHistogram()
    for m in metas:
        hist.merge(m.itl_hist)

    # The hit rates' definitions: docs/collect.md, "Hit rates".
    delivered = [r for r in prof if accepted(r)]
    hit_blocks = sum(r["theoretical_hit_blocks"] or 0 for r in delivered)
    blocks = sum(r["total_blocks"] or 0 for r in delivered)
    reported = [
        r for r in ok if r.get("cached_tokens") is not None and r.get("prompt_tokens_source") == "server"
    ]
    c_prompt = sum(r["prompt_tokens"] or 0 for r in reported)
    c_cached = sum(r["cached_tokens"] or 0 for r in reported)

    lags = sorted(r["dispatch_lag_s"] for r in records if r.get("dispatch_lag_s") is not None)
    firsts = [t for m in metas for t in m.first_dispatch]
    cpu = math.fsum(m.cpu_s for m in metas)
    wall = max(m.wall_s for m in metas)
    return {
        "schema_version": SCHEMA_VERSION,
        "counts": {
            "sent": len(prof),
            "ok": len(ok),
            "failed": len(failed),
            "failed_by_class": dict(sorted(by_class.items())),
            "warmup": len(warm),
        },
        "window": {
            "start_unix": t0_unix + w_start,
            "end_unix": t0_unix + stop_rel,
            "duration_s": duration,
        },
        "throughput": {
            "requests_per_s": _rate(len(in_win), duration),
            "input_tok_per_s": _rate(in_tok, duration),
            "output_tok_per_s": _rate(out_tok, duration),
            "total_tok_per_s": _rate(in_tok + out_tok, duration),
        },
        "latency": {
            "ttft_s": distribution([r["ttft_s"] for r in ok if r["ttft_s"] is not None]),
            "tpot_s": distribution(tpots),
            "itl_s": hist.distribution(),
            "e2e_s": distribution([r["e2e_s"] for r in ok if r["e2e_s"] is not None]),
            "interactivity_tok_per_s": distribution([1.0 / t for t in tpots if t > 0]),
        },
        "slo": {
            "ttft_s": slo_ttft,
            "tpot_s": slo_tpot,
            "goodput_requests_per_s": _rate(len(good), duration),
            "attainment": (len(good) / len(judged)) if judged else None,
        },
        "cache": {
            "theoretical_hit_rate": (hit_blocks / blocks) if blocks else None,
            "client_hit_rate": (c_cached / c_prompt) if c_prompt else None,
            "prompt_tokens": c_prompt,
            "cached_tokens": c_cached,
        },
        "self_audit": {
            "dispatch_lag_s": {
                "p50": percentile(lags, 50.0),
                "p99": percentile(lags, 99.0),
                "max": lags[-1] if lags else None,
            },
            "first_dispatch_spread_s": (max(firsts) - min(firsts)) if firsts else None,
            "client_cpu_s": cpu,
            "client_cpu_share": (cpu / wall) if wall > 0 else None,
            "workers": len(metas),
            "stop_reason": metas[0].reason
            if len(metas) == 1
            else ",".join(sorted({m.reason for m in metas})),
            "abandoned_in_flight": sum(m.abandoned for m in metas),
            "idle_lanes": sum(m.idle_lanes for m in metas),
            "unsent_requests": sum(m.planned - m.sent for m in metas),
        },
        "users": users,
        "options": options,
    }


__all__ = ["RunMeta", "accepted", "build_summary", "read_records", "write_summary"]
