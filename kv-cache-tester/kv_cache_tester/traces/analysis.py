"""Corpus statistics and theoretical prefix-cache hits (the library behind `kv-cache-tester analyze`).

* :func:`request_hits`: per request, in global time order (every trace starts at its ``t0``, sub-agent
  requests at spawn + their own ``t``), the hit blocks of an infinite cache and optionally of a finite
  LRU of ``cache_blocks`` blocks with a second tier of ``second_tier_blocks``. All traces share the
  finite cache (as they share a server); scopes keep their ids apart.
* :func:`corpus_stats`: counts and distributions (ISL, OSL, think time, turns, requests per trace,
  sub-agent fan-out, session duration) with percentiles and histograms, stdlib only.
* :func:`hit_summary`: aggregate hit rates of :func:`request_hits` records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kv_cache_tester.stats import percentile
from kv_cache_tester.traces.cache import LRUPrefixCache, PrefixTracker
from kv_cache_tester.traces.model import Trace

PERCENTILES = (50, 90, 95, 99)


@dataclass(slots=True)
class RequestHits:
    trace_id: str
    session_id: str  # trace id, or trace:agent for a sub-agent
    turn: int  # request index within its owner
    t: float  # start in dataset time (s)
    in_tokens: int
    out_tokens: int
    total_blocks: int
    inf_hit_blocks: int
    lru_hit_blocks: int | None = None  # first-tier hits of the finite cache
    lru_tier2_hit_blocks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def request_hits(
    traces: Sequence[Trace], *, cache_blocks: int | None = None, second_tier_blocks: int = 0
) -> list[RequestHits]:
    events = []
    for order, trace in enumerate(traces):
        for seq, (t, agent, req) in enumerate(trace.timeline()):
            events.append((trace.t0 + t, order, seq, trace, agent, req))
    events.sort(key=lambda e: e[:3])
    infinite = PrefixTracker()
    lru = LRUPrefixCache(cache_blocks, second_tier_blocks) if cache_blocks is not None else None
    out: list[RequestHits] = []
    for t, _, _, trace, agent, req in events:
        scope = trace.scope_key
        rec = RequestHits(
            trace_id=trace.trace_id,
            session_id=trace.trace_id if agent is None else f"{trace.trace_id}:{agent.agent_id}",
            turn=req.index,
            t=round(t, 6),
            in_tokens=req.in_tokens,
            out_tokens=req.out_tokens,
            total_blocks=len(req.hash_ids),
            inf_hit_blocks=infinite.observe(req.hash_ids, scope),
        )
        if lru is not None:
            rec.lru_hit_blocks, rec.lru_tier2_hit_blocks = lru.observe(req.hash_ids, scope)
        out.append(rec)
    return out


def hit_summary(records: Sequence[RequestHits]) -> dict[str, Any]:
    """Block-weighted hit rates (hit blocks / total blocks) over all records."""
    total = sum(r.total_blocks for r in records)

    def rate(values: Iterable[int | None]) -> float | None:
        vals = [v for v in values if v is not None]
        if not vals or not total:
            return None
        return sum(vals) / total

    return {
        "requests": len(records),
        "total_blocks": total,
        "infinite_hit_rate": rate(r.inf_hit_blocks for r in records),
        "lru_hit_rate": rate(r.lru_hit_blocks for r in records),
        "lru_tier2_hit_rate": rate(r.lru_tier2_hit_blocks for r in records),
    }


def histogram(values: Sequence[float], bins: int = 20) -> dict[str, Any]:
    if not values:
        return {"edges": [], "counts": []}
    lo, hi = min(values), max(values)
    if hi == lo:
        return {"edges": [lo, hi], "counts": [len(values)]}
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    return {"edges": [lo + k * width for k in range(bins + 1)], "counts": counts}


def distribution(values: Iterable[float], bins: int = 20) -> dict[str, Any]:
    vals = sorted(values)
    summary: dict[str, Any] = {
        "count": len(vals),
        "mean": (sum(vals) / len(vals)) if vals else None,
        "min": vals[0] if vals else None,
        "max": vals[-1] if vals else None,
    }
    for q in PERCENTILES:
        summary[f"p{q}"] = percentile(vals, q)
    summary["histogram"] = histogram(vals, bins)
    return summary


def corpus_samples(traces: Sequence[Trace]) -> dict[str, list[float]]:
    """The raw samples behind each distribution of :func:`corpus_stats`."""
    samples: dict[str, list[float]] = {
        "isl": [],
        "osl": [],
        "think_time_s": [],
        "turns": [],
        "requests_per_trace": [],
        "subagent_fanout": [],
        "session_duration_s": [],
    }
    for trace in traces:
        samples["turns"].append(len(trace.requests))
        samples["requests_per_trace"].append(trace.num_requests)
        samples["subagent_fanout"].extend(len(g.agents) for g in trace.groups)
        end = 0.0
        for t, _agent, req in trace.timeline():
            samples["isl"].append(req.in_tokens)
            samples["osl"].append(req.out_tokens)
            end = max(end, t + req.api_time)
        samples["think_time_s"].extend(r.think_time for r in trace.requests[1:])
        samples["session_duration_s"].append(end)
    return samples


def corpus_stats(traces: Sequence[Trace]) -> dict[str, Any]:
    samples = corpus_samples(traces)
    agents = sum(len(g.agents) for t in traces for g in t.groups)
    sub_requests = sum(len(a.requests) for t in traces for g in t.groups for a in g.agents)
    return {
        "counts": {
            "traces": len(traces),
            "requests": sum(t.num_requests for t in traces),
            "parent_requests": sum(len(t.requests) for t in traces),
            "subagent_requests": sub_requests,
            "subagent_groups": sum(len(t.groups) for t in traces),
            "subagents": agents,
            "input_tokens": sum(samples["isl"]),
            "output_tokens": sum(samples["osl"]),
        },
        "distributions": {name: distribution(vals) for name, vals in samples.items()},
    }


def write_histograms_png(traces: Sequence[Trace], records: Sequence[RequestHits], path: str) -> bool:
    """A PNG of the distributions; False (and nothing written) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    samples = corpus_samples(traces)
    samples["infinite_cache_hit_fraction"] = [
        r.inf_hit_blocks / r.total_blocks for r in records if r.total_blocks
    ]
    titles = {
        "isl": "input tokens per request",
        "osl": "output tokens per request",
        "think_time_s": "think time (s)",
        "turns": "parent turns per trace",
        "requests_per_trace": "requests per trace (with sub-agents)",
        "subagent_fanout": "sub-agents per fan-out",
        "session_duration_s": "session duration (s)",
        "infinite_cache_hit_fraction": "hit fraction, infinite cache",
    }
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for ax, (name, title) in zip(axes.flat, titles.items(), strict=True):
        vals = samples[name]
        if vals:
            ax.hist(vals, bins=30, color="#4477aa")
        else:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("count")
    fig.suptitle(f"{len(traces)} traces, {sum(t.num_requests for t in traces)} requests")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
