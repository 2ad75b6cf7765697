"""Prometheus exposition of the engine's state in the vLLM or the SGLang dialect.

Each server gets its own ``CollectorRegistry`` with one custom collector that reads the engine's
plain counters at scrape time, so the engine loop never touches a Prometheus object (cheap steps)
and two servers in one process never share series. Counters are exposed with the ``_total``
suffix by prometheus_client, as the real engines expose them.

Beside the engine's dialect, the same /metrics serves its simulated GPUs' power, energy, temperature,
utilisation and memory in the DCGM exporter's names (``DcgmCollector``), so a cell samples a
simulated GPU as it would a real one behind dcgm-exporter.
"""

from __future__ import annotations

import math
import os
import socket
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agentsweep.engine_sim.profiles import ACTIVATION_RESERVE_BYTES, Deployment, weight_read_s
from agentsweep.engine_sim.stats import EngineStats, Histogram

DIALECTS = ("vllm", "sglang")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class Snapshot:
    """Instantaneous engine state the gauges report."""

    running: int
    waiting: int
    gpu_usage: float  # 0..1 of the GPU block pool in use
    gpu_blocks: int
    block_size: int
    used_tokens: int
    cpu_used_tokens: int
    cpu_total_tokens: int
    bytes_gpu_to_cpu: int
    bytes_cpu_to_gpu: int
    evicted_tokens: int
    retracted_last: int  # SGLang: retractions of the most recent step
    pinned_blocks: int = 0  # prefill role: blocks held for decodes not yet served


def _hist(
    name: str, doc: str, labels: dict[str, str], h: Histogram, scale: float = 1.0
) -> HistogramMetricFamily:
    """``scale`` converts the recorded unit into the exposed one (bucket bounds and sum)."""
    fam = HistogramMetricFamily(name, doc, labels=list(labels))
    buckets = h.cumulative()
    if scale != 1.0:
        buckets = [(b if b == "+Inf" else repr(float(b) * scale), n) for b, n in buckets]
    fam.add_metric(list(labels.values()), buckets, h.sum * scale)
    return fam


class _Base(Collector):
    def __init__(self, stats: EngineStats, snapshot: Callable[[], Snapshot], labels: dict[str, str]) -> None:
        self.stats = stats
        self.snapshot = snapshot
        self.labels = labels

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, doc, labels=list(self.labels))
        fam.add_metric(list(self.labels.values()), value)
        return fam

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=list(self.labels))
        fam.add_metric(list(self.labels.values()), value)
        return fam

    def _sim_transfer(self, s: Snapshot) -> Iterator[Metric]:
        """Transfer figures neither engine exports under one name (sim-only, both dialects)."""
        st = self.stats
        fam = GaugeMetricFamily(
            "engine_sim:disaggregation_mode",
            "Disaggregated serving role (1 for the role served).",
            labels=[*self.labels, "mode"],
        )
        fam.add_metric([*self.labels.values(), st.kv_role], 1.0)
        yield fam
        yield self._counter(
            "engine_sim:kv_transfer_tokens",
            "Prompt tokens whose KV this decode received from a prefill instance (modelled transfer).",
            st.kv_transfer_tokens,
        )
        yield self._counter(
            "engine_sim:kv_transfer_bytes",
            "KV bytes this decode received from prefill instances.",
            st.kv_transfer_bytes,
        )
        yield self._gauge(
            "engine_sim:kv_transfer_pinned_blocks",
            "Blocks finished prefills hold until their decode takes them.",
            s.pinned_blocks,
        )

    def _by(self, name: str, doc: str, label: str, values: Mapping[str, float]) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=[*self.labels, label])
        for key, value in values.items():
            fam.add_metric([*self.labels.values(), key], value)
        return fam


class VllmCollector(_Base):
    def collect(self) -> Iterator[Metric]:
        st, s = self.stats, self.snapshot()
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", s.running
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.gpu_usage
        )
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*self.labels, "block_size", "num_gpu_blocks", "num_cpu_blocks"],
        )
        cpu_blocks = s.cpu_total_tokens // s.block_size
        info.add_metric([*self.labels.values(), str(s.block_size), str(s.gpu_blocks), str(cpu_blocks)], 1.0)
        yield info
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            st.prefix_queries,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            st.prefix_hits,
        )
        yield self._counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector, in terms of number of queried tokens.",
            st.external_queries,
        )
        yield self._counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector, in terms of number of cached tokens.",
            st.external_hits,
        )
        yield self._by(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            {
                "local_compute": st.prompt_local_compute,
                "local_cache_hit": st.prompt_local_hit,
                "external_kv_transfer": st.prompt_external_hit + st.prompt_remote_hit,
            },
        )
        cached = {"device": st.prompt_local_hit, "host": st.prompt_external_hit}
        if st.kv_role != "null":
            cached["external_kv_transfer"] = st.prompt_remote_hit
        yield self._by(
            "vllm:prompt_tokens_cached_by_source",
            "Number of cached prompt tokens by the tier they were found in.",
            "source",
            cached,
        )
        yield self._counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            st.prompt_local_hit + st.prompt_external_hit + st.prompt_remote_hit,
        )
        if st.kv_role != "null":
            yield _hist(
                "vllm:nixl_xfer_time_seconds",
                "Histogram of transfer duration for NIXL KV Cache transfers.",
                self.labels,
                st.kv_transfer_time,
            )
            yield _hist(
                "vllm:nixl_bytes_transferred",
                "Histogram of bytes transferred per NIXL KV Cache transfers.",
                self.labels,
                st.kv_transfer_size,
            )
            yield self._counter(
                "vllm:nixl_num_failed_transfers",
                "Number of failed NIXL KV Cache transfers.",
                st.kv_transfer_failed,
            )
            yield self._counter(
                "vllm:nixl_num_kv_expired_reqs",
                "Number of requests whose KV blocks expired before a decode took them.",
                st.kv_transfer_expired,
            )
            yield from self._sim_transfer(s)
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", st.preemptions
        )
        # vLLM publishes evictions only as KV-cache events (BlockRemoved); the simulator counts them.
        yield self._counter(
            "engine_sim:evicted_tokens",
            "Tokens of cached blocks evicted from the device cache for new content (sim-only).",
            s.evicted_tokens,
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens)
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", st.generation_tokens
        )
        yield self._by(
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            {k: v for k, v in st.requests_finished.items() if k != "abort"},
        )
        yield self._by(
            "vllm:kv_offload_total_bytes",
            "Number of bytes offloaded by KV connector",
            "transfer_type",
            {"GPU_to_CPU": s.bytes_gpu_to_cpu, "CPU_to_GPU": s.bytes_cpu_to_gpu},
        )
        yield _hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            self.labels,
            st.ttft,
        )
        yield _hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            self.labels,
            st.itl,
        )
        yield _hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            self.labels,
            st.e2e,
        )


class SglangCollector(_Base):
    def collect(self) -> Iterator[Metric]:
        st, s = self.stats, self.snapshot()
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.", s.running)
        yield self._gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", s.waiting)
        yield self._gauge("sglang:token_usage", "The token usage.", s.gpu_usage)
        yield self._gauge("sglang:num_used_tokens", "The number of used tokens.", s.used_tokens)
        yield self._gauge(
            "sglang:max_total_num_tokens",
            "Maximum total number of tokens in the KV pool.",
            s.gpu_blocks * s.block_size,
        )
        hit_rate = (st.prefix_hits + st.external_hits) / st.prefix_queries if st.prefix_queries else 0.0
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hit_rate)
        cached = {"device": st.prompt_local_hit, "host": st.prompt_external_hit}
        if st.kv_role != "null":
            cached["remote"] = st.prompt_remote_hit  # transferred from the prefill instance
        yield self._by(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by the tier they were found in.",
            "cache_source",
            cached,
        )
        if st.kv_role != "null":
            yield _hist(
                "sglang:kv_transfer_latency_ms",
                "The transfer latency of the KV cache in ms.",
                self.labels,
                st.kv_transfer_time,
                scale=1e3,
            )
            yield _hist(
                "sglang:kv_transfer_total_mb",
                "The total size of the KV cache transferred per request in MB.",
                self.labels,
                st.kv_transfer_size,
                scale=1e-6,
            )
            yield self._gauge(
                "sglang:kv_transfer_speed_gb_s",
                "The transfer speed of the KV cache in GB/s (most recent transfer).",
                st.kv_transfer_last_gbs,
            )
            yield self._counter(
                "sglang:num_transfer_failed_reqs",
                "Number of requests whose KV transfer failed.",
                st.kv_transfer_failed,
            )
            yield self._counter(
                "engine_sim:kv_transfer_expired",
                "Prefilled prompts whose blocks no decode took in time (freed).",
                st.kv_transfer_expired,
            )
            yield from self._sim_transfer(s)
        yield self._counter("sglang:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens)
        yield self._counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", st.generation_tokens
        )
        yield self._gauge("sglang:num_retracted_reqs", "The number of retracted requests.", s.retracted_last)
        yield self._counter(
            "sglang:num_retracted_requests", "Total number of retracted requests.", st.preemptions
        )
        yield self._counter(
            "sglang:evicted_tokens", "Tokens evicted from the device cache.", s.evicted_tokens
        )
        yield self._counter(
            "sglang:load_back_tokens",
            "Tokens loaded back from host memory to device.",
            st.external_hits,
        )
        yield self._gauge(
            "sglang:hicache_host_used_tokens", "Tokens in the host KV cache.", s.cpu_used_tokens
        )
        yield self._gauge(
            "sglang:hicache_host_total_tokens", "Host KV cache capacity in tokens.", s.cpu_total_tokens
        )
        yield _hist(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            self.labels,
            st.ttft,
        )
        yield _hist(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            self.labels,
            st.itl,
        )
        yield _hist(
            "sglang:e2e_request_latency_seconds",
            "Histogram of E2E request latency in seconds.",
            self.labels,
            st.e2e,
        )


def build_registry(
    dialect: str, model_name: str, stats: EngineStats, snapshot: Callable[[], Snapshot]
) -> CollectorRegistry:
    """A fresh registry exposing ``stats`` and ``snapshot()`` in ``dialect``."""
    registry = CollectorRegistry(auto_describe=False)
    if dialect == "vllm":
        registry.register(VllmCollector(stats, snapshot, {"model_name": model_name, "engine": "0"}))
    elif dialect == "sglang":
        registry.register(SglangCollector(stats, snapshot, {"model_name": model_name}))
    else:
        raise ValueError(f"unknown metrics dialect {dialect!r} (choose from {', '.join(DIALECTS)})")
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


# -- the simulated GPUs: DCGM exporter metrics ------------------------------------------------------
#
# The simulated engine is a GPU too. Each of its tensor-parallel GPUs draws idle power plus a share of
# the rest of its board power that follows the simulated load of each stretch between two reads of
# /metrics, from the step model:
#
#     compute load = (b x prompt tokens computed + c x tokens generated) / elapsed   (tensor cores)
#     memory load  = steps x (time to read the weights every token uses) / elapsed  (HBM)
#     power        = idle + (board - idle) x min(1, COMPUTE_SHARE x compute + MEMORY_SHARE x memory)
#
# (each load capped at 1; b, c as in ``profiles.StepCost``; board and idle power in ``profiles.HARDWARE``).
# A GPU running only prefill compute reaches its board power; decoding, bound by the weight reads, draws
# about 60 % of the range above idle. These two shares are assumptions of the model, not measurements.
# Energy is the integral of that power over the engine's own clock (the counter counts engine seconds, as
# every other figure of a sped-up simulated engine does); utilisation is the busy share (steps x a + the
# compute above); the power and utilisation served are means over the last POWER_AVERAGE_S (GpuMeter);
# temperature approaches 33 + 32 x power / board power °C with a 20 s time constant (recorded: an H100
# 36 °C idle, 63 °C after 15 s at its 700 W limit; an H200 41 °C and 64 °C); memory used is the
# weights, the activation reserve and the KV pool, allocated at start as a serving engine does.
COMPUTE_SHARE = 1.0
MEMORY_SHARE = 0.6
TEMP_BASE_C = 33.0
TEMP_RANGE_C = 32.0
TEMP_TIME_CONSTANT_S = 20.0
MIN_INTERVAL_S = 1e-3  # engine seconds: two scrapes closer than this read the same figures
# Power and utilisation are means over the last this many wall seconds (NVML averages a board's power
# over its last second), so over ``speed`` times as many seconds of a sped-up engine's clock: a sampler
# on the wall clock sees a sped-up simulated GPU as it would a real one.
POWER_AVERAGE_S = 1.0


@dataclass(frozen=True, slots=True)
class GpuWork:
    """The engine's cumulative work at one moment of its clock."""

    engine_s: float  # simulated seconds since start
    prompt_tokens_computed: int
    tokens_generated: int
    steps: int


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Constants of one engine instance's simulated GPUs (see the comment above)."""

    hardware: str
    gpus: int  # the tensor-parallel group
    board_power_w: float
    idle_power_w: float
    step_s: float  # a: fixed time of a step
    prefill_token_s: float  # b
    decode_token_s: float  # c
    weight_read_s: float  # the memory-bound part of a
    memory_used_mib: float


class GpuMeter:
    """Integrates the simulated GPUs' power over the engine's clock; power and utilisation are read off
    those integrals as means over the last ``window_s`` of the engine's clock.

    Any read of /metrics brings the integrals up to now (the load of each stretch between two reads
    follows from the work done in it). A reading then depends only on when it is taken, not on who
    else reads: the cell's metrics collector scraping the same /metrics between two power samples
    changes neither, and the power samples and the energy counter describe the same draw. (Had power
    been the mean since the last read by anyone, a sample taken just after the collector's would
    stand for that short stretch alone, not for the time since the previous sample.)

    The GPUs of a tensor-parallel group share every step, so all of them read the same figures.
    """

    def __init__(self, model: GpuModel, work: Callable[[], GpuWork], window_s: float) -> None:
        self.model = model
        self.work = work
        self.window_s = window_s
        first = work()
        self._last = first
        self.energy_j = 0.0  # per GPU, since the engine started
        self.busy_s = 0.0  # engine seconds of work, since the engine started
        self.power_w = model.idle_power_w
        self.util = 0.0
        self.temp_c = TEMP_BASE_C + TEMP_RANGE_C * model.idle_power_w / model.board_power_w
        # (engine_s, energy_j, busy_s) at each read reaching back to the window's start: between two
        # reads the draw is constant, so the integrals are exact by linear interpolation.
        self._history: deque[tuple[float, float, float]] = deque([(first.engine_s, 0.0, 0.0)])

    def read(self) -> GpuMeter:
        now = self.work()
        dt = now.engine_s - self._last.engine_s
        if dt < MIN_INTERVAL_S:
            return self
        m, last = self.model, self._last
        prompt = now.prompt_tokens_computed - last.prompt_tokens_computed
        generated = now.tokens_generated - last.tokens_generated
        steps = now.steps - last.steps
        compute_s = m.prefill_token_s * prompt + m.decode_token_s * generated
        compute = min(1.0, compute_s / dt)
        memory = min(1.0, steps * m.weight_read_s / dt)
        load = min(1.0, COMPUTE_SHARE * compute + MEMORY_SHARE * memory)
        power_w = m.idle_power_w + (m.board_power_w - m.idle_power_w) * load
        self.energy_j += power_w * dt
        self.busy_s += min(1.0, (steps * m.step_s + compute_s) / dt) * dt
        target = TEMP_BASE_C + TEMP_RANGE_C * power_w / m.board_power_w
        self.temp_c = target + (self.temp_c - target) * math.exp(-dt / TEMP_TIME_CONSTANT_S)
        self._last = now
        self._window_means(now.engine_s)
        return self

    def _window_means(self, t: float) -> None:
        history = self._history
        history.append((t, self.energy_j, self.busy_s))
        start = t - self.window_s
        while len(history) > 2 and history[1][0] <= start:
            history.popleft()
        (t0, e0, b0), (t1, e1, b1) = history[0], history[1]
        if t0 < start:  # the window starts between the two oldest reads
            share = (start - t0) / (t1 - t0)
            t0, e0, b0 = start, e0 + (e1 - e0) * share, b0 + (b1 - b0) * share
        span = t - t0  # the whole window once the engine has run that long
        self.power_w = (self.energy_j - e0) / span
        self.util = min(1.0, (self.busy_s - b0) / span)


class DcgmCollector(Collector):
    """The five DCGM exporter metrics of ``etc/default-counters.csv`` that power sampling reads, one
    series per simulated GPU (labels as the exporter sets them: gpu, UUID, device, modelName, Hostname)."""

    def __init__(self, meter: GpuMeter, uuid_prefix: str) -> None:
        self.meter = meter
        host = socket.gethostname().split(".")[0]
        name = f"simulated {meter.model.hardware.upper()}"
        self.labels = [
            {
                "gpu": str(i),
                "UUID": f"{uuid_prefix}-{i}",
                "device": f"gpu{i}",
                "modelName": name,
                "Hostname": host,
            }
            for i in range(meter.model.gpus)
        ]

    def _family(self, name: str, doc: str, kind: str, value: float) -> Metric:
        fam = Metric(name, doc, kind)
        for labels in self.labels:
            fam.add_sample(name, labels, value)
        return fam

    def collect(self) -> Iterator[Metric]:
        g = self.meter.read()
        yield self._family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge", round(g.power_w, 3))
        yield self._family(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Total energy consumption since boot (in mJ).",
            "counter",
            float(round(g.energy_j * 1e3)),
        )
        yield self._family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge", round(g.temp_c))
        yield self._family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge", round(100 * g.util))
        yield self._family(
            "DCGM_FI_DEV_FB_USED",
            "Framebuffer memory used (in MiB).",
            "gauge",
            round(g.model.memory_used_mib),
        )


class _EngineLike(Protocol):
    """What the GPU meter reads of the engine: its clock, its counters and its step count."""

    stats: EngineStats
    steps: int

    @property
    def clock(self) -> Any: ...


def add_simulated_gpus(
    registry: CollectorRegistry, dep: Deployment, gpu_blocks: int, block_size: int, engine: _EngineLike
) -> CollectorRegistry:
    """Serve the DCGM metrics of ``engine``'s simulated GPUs (``dep.tp`` of them) on ``registry``;
    returns a registry of those alone (what a DCGM exporter would serve)."""
    kv_bytes = gpu_blocks * block_size * dep.kv_bytes_per_token_gpu
    model = GpuModel(
        hardware=dep.hardware.name,
        gpus=dep.tp,
        board_power_w=dep.hardware.board_power_w,
        idle_power_w=dep.hardware.idle_power_w,
        step_s=dep.cost.a,
        prefill_token_s=dep.cost.b,
        decode_token_s=dep.cost.c,
        weight_read_s=weight_read_s(dep),
        memory_used_mib=(dep.weight_bytes_gpu + ACTIVATION_RESERVE_BYTES + kv_bytes) / 2**20,
    )

    def work() -> GpuWork:
        st = engine.stats
        return GpuWork(float(engine.clock.now()), st.prompt_local_compute, st.generation_tokens, engine.steps)

    meter = GpuMeter(model, work, POWER_AVERAGE_S * float(engine.clock.speed))
    collector = DcgmCollector(meter, f"GPU-sim-{os.getpid()}")
    registry.register(collector)
    exporter = CollectorRegistry(auto_describe=True)
    exporter.register(collector)
    return exporter
