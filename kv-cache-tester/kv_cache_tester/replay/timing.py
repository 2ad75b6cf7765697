"""Inter-request delays: how long a session waits after its previous response before the next request."""

from __future__ import annotations

from kv_cache_tester.traces.model import Request

STRATEGIES = ("think-only", "original", "api-scaled")


def raw_delay(strategy: str, req: Request, prev: Request | None, api_time_scale: float = 1.0) -> float:
    """Recorded delay in trace seconds, before the --max-delay cap and --time-scale.

    think-only: the think time recorded before this request.
    original:   the recorded start-to-start gap to the previous request of the same session (for a
                sub-agent's first request: its start offset from the spawn).
    api-scaled: the previous request's api_time x api_time_scale + this request's think time
                (a faster or slower server than the recorded one).
    """
    if strategy == "think-only":
        d = req.think_time
    elif strategy == "original":
        d = req.t - prev.t if prev is not None else req.t
    elif strategy == "api-scaled":
        d = (prev.api_time * api_time_scale if prev is not None else 0.0) + req.think_time
    else:  # guarded by argparse choices
        raise ValueError(f"unknown timing strategy {strategy!r}")
    return max(0.0, d)


def scaled_delay(
    strategy: str,
    req: Request,
    prev: Request | None,
    *,
    max_delay: float,
    time_scale: float,
    api_time_scale: float = 1.0,
) -> float:
    """The wall-clock delay to wait: capped by max_delay (trace seconds; 0 = no delays), then x time_scale."""
    return min(raw_delay(strategy, req, prev, api_time_scale), max_delay) * time_scale
