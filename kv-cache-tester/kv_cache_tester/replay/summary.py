"""summary.json, computed from requests.jsonl (the one source of truth) plus the run's own facts.

Definitions (docs/replayer.md repeats them):
- profiling span: starts when the last warmup request finished (the run start when there is none),
  ends when dispatching stopped (duration reached, signal, circuit breaker, or traces exhausted).
- window: the steady part of the span (replay/steady.py: ramp-up and drain excluded); its bounds and
  rule are in summary.json's ``window``.
- counts and latency percentiles: every profile-phase request (a request dispatched before the
  window start by a lane whose warmup was over is profile too); warmup requests only in
  counts.warmup.
- throughput, goodput and the stability block: profile requests that finished successfully inside
  the window, divided by the window duration (stability: replay/stability.py).
- latency statistics and interactivity: kv_cache_tester.metrics (one definition, docs/metrics.md).
- engine_clock (only when the server stated each request's own timeline, as the simulated engine
  does): the same latencies and throughput in the engine's clock, and the gap between the client's
  figures (times the engine's speed) and the engine's own (see ``_engine_clock``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kv_cache_tester.metrics import (
    e2e_norm_interactivity_stats,
    interactivity_stats,
    record_e2e_per_output_token_s,
    record_full_response_itl_s,
    stats_of,
)
from kv_cache_tester.replay.presets import PRESETS, deviations
from kv_cache_tester.replay.results import (
    SCHEMA_VERSION,
    Cache,
    ClockGap,
    Counts,
    EngineClock,
    EngineTimes,
    Latency,
    RequestRecord,
    SelfAudit,
    Slo,
    Summary,
    Throughput,
    Window,
    accepted,
    read_records,
    write_summary,
)
from kv_cache_tester.replay.stability import SUBWINDOW_S, stability_block
from kv_cache_tester.replay.steady import RULE, steady_window
from kv_cache_tester.stats import HistogramState, LogHistogram, percentile

GAP_ROUNDING = 1e-9  # relative client/engine clock gaps below this are float rounding


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
    idle_advanced_s: float = 0.0  # wall seconds --system-idle-cap advanced the pending delays by


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
    stability_subwindow_s: float = SUBWINDOW_S,
) -> Summary:
    records = (
        read_records(records_path, required=RequestRecord.__required_keys__) if records_path.exists() else []
    )
    warm = [r for r in records if r.get("phase") == "warmup"]
    prof = [r for r in records if r.get("phase") != "warmup"]
    window = _Window.of(warm, metas, records)
    ok = [r for r in prof if r["status"] == "ok"]
    in_win = [r for r in ok if window.holds(r)]
    summary: Summary = {
        "schema_version": SCHEMA_VERSION,
        "counts": _counts(prof, len(ok), len(warm)),
        "window": window.typed(),
        "throughput": _throughput(in_win, window.duration),
        "latency": _latency(ok, metas),
        "slo": _slo(prof, in_win, window, slo_ttft, slo_tpot),
        "cache": _cache(prof, ok),
        "self_audit": _self_audit(records, metas),
        "users": users,
        "options": options,
        "stability": stability_block(in_win, window.start, window.stop, stability_subwindow_s),
    }
    preset = options.get("preset")
    if isinstance(preset, str) and preset in PRESETS:
        summary["preset"] = {"name": preset, "deviations": deviations(preset, options)}
    engine = _engine_clock(ok, in_win, window.duration)
    if engine is not None:
        summary["engine_clock"] = engine
    return summary


@dataclass(frozen=True, slots=True)
class _Window:
    """The profiling window, in seconds after the run start (definition at the top)."""

    t0_unix: float
    start: float
    stop: float
    span_start: float
    span_stop: float
    peak: float = 0.0
    threshold: float = 0.0

    @classmethod
    def of(cls, warm: list[RequestRecord], metas: list[RunMeta], records: list[RequestRecord]) -> _Window:
        stop = max(m.stop_rel for m in metas)
        start = min(max((r["t_done"] for r in warm), default=0.0), stop)
        steady = steady_window(((r["t_dispatch"], r["t_done"]) for r in records), start, stop)
        return cls(
            min(m.t0_unix for m in metas),
            steady.start,
            steady.stop,
            start,
            stop,
            steady.peak_in_flight,
            steady.threshold,
        )

    @property
    def duration(self) -> float:
        return self.stop - self.start

    def holds(self, r: RequestRecord) -> bool:
        """Whether the request finished inside the window."""
        return self.start <= r["t_done"] <= self.stop

    def typed(self) -> Window:
        return {
            "start_unix": self.t0_unix + self.start,
            "end_unix": self.t0_unix + self.stop,
            "duration_s": self.duration,
            "rule": RULE,
            "start_s": self.start,
            "end_s": self.stop,
            "span_start_unix": self.t0_unix + self.span_start,
            "span_end_unix": self.t0_unix + self.span_stop,
            "peak_in_flight": self.peak,
            "threshold_in_flight": self.threshold,
        }


def _counts(prof: list[RequestRecord], ok: int, warmup: int) -> Counts:
    by_class: dict[str, int] = {}
    for r in prof:
        if r["status"] != "ok":
            error = r.get("error")
            cls = (error.get("class") if error else None) or "unknown"
            by_class[cls] = by_class.get(cls, 0) + 1
    return {
        "sent": len(prof),
        "ok": ok,
        "failed": len(prof) - ok,
        "failed_by_class": dict(sorted(by_class.items())),
        "warmup": warmup,
    }


def _throughput(in_win: list[RequestRecord], duration: float) -> Throughput:
    in_tok = sum(r["prompt_tokens"] or 0 for r in in_win)
    out_tok = sum(r["output_tokens"] or 0 for r in in_win)
    return {
        "requests_per_s": _rate(len(in_win), duration),
        "input_tok_per_s": _rate(in_tok, duration),
        "output_tok_per_s": _rate(out_tok, duration),
        "total_tok_per_s": _rate(in_tok + out_tok, duration),
    }


def _latency(ok: list[RequestRecord], metas: list[RunMeta]) -> Latency:
    hist = LogHistogram()
    for m in metas:
        hist.merge(m.itl_hist)
    itl = hist.distribution()
    full = [i for r in ok if (i := record_full_response_itl_s(r)) is not None]
    full_stats = stats_of(full)
    per_token = [v for r in ok if (v := record_e2e_per_output_token_s(r)) is not None]
    return {
        "ttft_s": stats_of(t for r in ok if (t := r["ttft_s"]) is not None),
        "tpot_s": stats_of(t for r in ok if (t := r["tpot_s"]) is not None),
        "itl_s": itl,
        "e2e_s": stats_of(t for r in ok if (t := r["e2e_s"]) is not None),
        "full_response_itl_s": full_stats,
        "interactivity_tok_per_s": interactivity_stats(full_stats, (1.0 / i for i in full if i > 0)),
        "plain_interactivity_tok_per_s": interactivity_stats(itl),
        "output_speed_tok_per_s": stats_of(1.0 / i for i in full if i > 0),
        "e2e_per_output_token_s": stats_of(per_token),
        "e2e_norm_interactivity_tok_per_s": e2e_norm_interactivity_stats(per_token),
    }


def _engine_clock(
    ok: list[RequestRecord], in_win: list[RequestRecord], duration: float
) -> EngineClock | None:
    """The latencies and throughput in the engine's own clock, from the timelines the server stated
    (None when no ok request carries one: a real engine).

    TTFT, TPOT and E2E are the statistics of the engine's per-request figures (one definition:
    kv_cache_tester.metrics); ITL is per token,
    each request's gaps counted at its own mean ITL (the timeline keeps a summary, not every gap);
    throughput divides the window's requests and tokens by the window in engine seconds (its wall
    length times the speed). ``gap`` compares the client's wall-clock figures, times the speed, with
    the engine's over the same requests: what the client and HTTP path add.
    """
    timed = [(r, e) for r in ok if (e := r.get("engine")) is not None]
    if not timed:
        return None
    speed = timed[0][1]["speed"]
    tpots = [t for _, e in timed if (t := e["tpot_s"]) is not None]
    itl = LogHistogram()
    for _, e in timed:
        mean = e["itl_s"]["mean"]
        if mean is not None:
            itl.add_count(mean, e["itl_s"]["n"])
    itl_stats = itl.distribution()
    full_stats = stats_of(tpots)  # an engine's TPOT is the request's full-response ITL (metrics.py)
    per_token = [v for _, e in timed if (v := record_e2e_per_output_token_s(e)) is not None]
    latency: Latency = {
        "ttft_s": stats_of(t for _, e in timed if (t := e["ttft_s"]) is not None),
        "tpot_s": full_stats,
        "itl_s": itl_stats,
        "e2e_s": stats_of(e["e2e_s"] for _, e in timed),
        "full_response_itl_s": full_stats,
        "interactivity_tok_per_s": interactivity_stats(full_stats, (1.0 / t for t in tpots if t > 0)),
        "plain_interactivity_tok_per_s": interactivity_stats(itl_stats),
        "output_speed_tok_per_s": stats_of(1.0 / t for t in tpots if t > 0),
        "e2e_per_output_token_s": stats_of(per_token),
        "e2e_norm_interactivity_tok_per_s": e2e_norm_interactivity_stats(per_token),
    }
    return {
        "speed": speed,
        "records": len(timed),
        "of": len(ok),
        "latency": latency,
        "throughput": _throughput(in_win, duration * speed),
        "gap": _clock_gap(timed, speed),
    }


def _clock_gap(timed: list[tuple[RequestRecord, EngineTimes]], speed: float) -> ClockGap:
    ttft = [
        (c * speed, e) for r, t in timed if (c := r["ttft_s"]) is not None and (e := t["ttft_s"]) is not None
    ]
    e2e = [(c * speed, t["e2e_s"]) for r, t in timed if (c := r["e2e_s"]) is not None]
    wall = math.fsum(c for c, _ in e2e)
    return {
        "ttft_p50": _ratio_gap([c for c, _ in ttft], [e for _, e in ttft]),
        "e2e_p50": _ratio_gap([c for c, _ in e2e], [e for _, e in e2e]),
        "e2e_share": _rounded((wall - math.fsum(e for _, e in e2e)) / wall) if wall > 0 else None,
    }


def _ratio_gap(client: list[float], engine: list[float]) -> float | None:
    """Client p50 / engine p50 - 1 (None without both)."""
    c, e = percentile(sorted(client), 50.0), percentile(sorted(engine), 50.0)
    return _rounded(c / e - 1.0) if c is not None and e else None


def _rounded(gap: float) -> float:
    """0 for a gap within float rounding: a client on the engine's own clock (a virtual-time run) sees
    exactly the engine's times, which the multiplication by the speed leaves a few ulps apart."""
    return 0.0 if abs(gap) < GAP_ROUNDING else gap


def _meets(r: RequestRecord, slo_ttft: float | None, slo_tpot: float | None) -> bool:
    ttft, tpot = r["ttft_s"], r["tpot_s"]
    if slo_ttft is not None and (ttft is None or ttft > slo_ttft):
        return False
    return not (slo_tpot is not None and tpot is not None and tpot > slo_tpot)


def _slo(
    prof: list[RequestRecord],
    in_win: list[RequestRecord],
    window: _Window,
    slo_ttft: float | None,
    slo_tpot: float | None,
) -> Slo:
    good = sum(1 for r in in_win if _meets(r, slo_ttft, slo_tpot))
    judged = sum(1 for r in prof if window.holds(r))
    return {
        "ttft_s": slo_ttft,
        "tpot_s": slo_tpot,
        "goodput_requests_per_s": _rate(good, window.duration),
        "attainment": (good / judged) if judged else None,
    }


def _cache(prof: list[RequestRecord], ok: list[RequestRecord]) -> Cache:
    """The hit rates; their definitions: docs/collect.md, "Hit rates"."""
    delivered = [r for r in prof if accepted(r)]
    hit_blocks = sum(r["theoretical_hit_blocks"] or 0 for r in delivered)
    blocks = sum(r["total_blocks"] or 0 for r in delivered)
    reported = [
        r for r in ok if r.get("cached_tokens") is not None and r.get("prompt_tokens_source") == "server"
    ]
    c_prompt = sum(r["prompt_tokens"] or 0 for r in reported)
    c_cached = sum(r["cached_tokens"] or 0 for r in reported)
    return {
        "theoretical_hit_rate": (hit_blocks / blocks) if blocks else None,
        "client_hit_rate": (c_cached / c_prompt) if c_prompt else None,
        "prompt_tokens": c_prompt,
        "cached_tokens": c_cached,
    }


def _self_audit(records: list[RequestRecord], metas: list[RunMeta]) -> SelfAudit:
    lags = sorted(lag for r in records if (lag := r.get("dispatch_lag_s")) is not None)
    firsts = [t for m in metas for t in m.first_dispatch]
    cpu = math.fsum(m.cpu_s for m in metas)
    wall = max(m.wall_s for m in metas)
    return {
        "dispatch_lag_s": {
            "p50": percentile(lags, 50.0),
            "p99": percentile(lags, 99.0),
            "max": lags[-1] if lags else None,
        },
        "first_dispatch_spread_s": (max(firsts) - min(firsts)) if firsts else None,
        "client_cpu_s": cpu,
        "client_cpu_share": (cpu / wall) if wall > 0 else None,
        "workers": len(metas),
        "stop_reason": metas[0].reason if len(metas) == 1 else ",".join(sorted({m.reason for m in metas})),
        "abandoned_in_flight": sum(m.abandoned for m in metas),
        "idle_lanes": sum(m.idle_lanes for m in metas),
        "unsent_requests": sum(m.planned - m.sent for m in metas),
        "idle_advanced_s": math.fsum(m.idle_advanced_s for m in metas),
    }


__all__ = ["RunMeta", "accepted", "build_summary", "read_records", "write_summary"]
