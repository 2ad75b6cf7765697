"""Plain counters the engine updates; the metrics module renders them in a dialect at scrape time."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

TRANSFER_S_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    5.0,
)
TRANSFER_BYTES_BUCKETS = tuple(float(2**20 * 4**k) for k in range(11))  # 1 MiB .. 1 TiB


class Histogram:
    """Cumulative-ready bucket counts; ``observe`` takes a count so batched steps cost one call."""

    __slots__ = ("bounds", "counts", "sum", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last = +Inf
        self.sum = 0.0
        self.total = 0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count
        self.total += count

    def cumulative(self) -> list[tuple[str, int]]:
        out = []
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((repr(float(bound)), acc))
        out.append(("+Inf", self.total))
        return out


@dataclass(slots=True)
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0  # tokens looked up in the GPU prefix cache (first lookups only)
    prefix_hits: int = 0  # tokens found there
    preempted_queries: int = 0  # lookups of preempted requests, kept apart (not exported, as vLLM)
    preempted_hits: int = 0  # their hits (GPU and CPU tier)
    external_queries: int = 0  # tokens looked up in the offload tier
    external_hits: int = 0
    prompt_local_compute: int = 0  # prompt tokens by source, counted once per request
    prompt_local_hit: int = 0
    prompt_external_hit: int = 0
    prompt_remote_hit: int = 0  # decode role: prompt tokens whose KV came from the prefill instance
    preemptions: int = 0
    requests_finished: dict[str, int] = field(default_factory=lambda: {"length": 0, "stop": 0, "abort": 0})
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    # Disaggregated serving (``disagg.py``): the role, and the decode's modelled KV handoffs.
    kv_role: str = "null"
    kv_transfers: int = 0
    kv_transfer_tokens: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_failed: int = 0  # decode: handoffs that could not be made (prefill unreachable, timeout)
    kv_transfer_expired: int = 0  # prefill: pinned prompts no decode took in time
    kv_transfer_last_gbs: float = 0.0
    kv_transfer_time: Histogram = field(default_factory=lambda: Histogram(TRANSFER_S_BUCKETS))
    kv_transfer_size: Histogram = field(default_factory=lambda: Histogram(TRANSFER_BYTES_BUCKETS))
