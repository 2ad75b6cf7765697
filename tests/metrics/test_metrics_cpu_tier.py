"""The CPU (offload) tier read from the engine: its lookups and hits mapped onto server_metrics.csv, its
hit rate over the profiling window, and the report's cache panel naming where the lookups came from.

The expositions are rendered with prometheus_client (what both engines serve /metrics with) from the
pinned releases' metric definitions: names, help texts and label names as vLLM 0.33.0 and SGLang
0.5.23 define them, each cited by file and line of the release (vLLM: the vllm-0.33.0 wheel's
``vllm/``; SGLang: the sglang-0.5.23 wheel's ``sglang/``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from agentsweep.collect.report import hit_rows
from agentsweep.collect.window import INFERRED, READ_FROM_ENGINE, cpu_tier_figures, window_figures
from agentsweep.metrics.dialects import COLUMNS, format_row, map_text, map_text_sources
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

VLLM = {"model_name": "m", "engine": "0"}  # vllm/v1/metrics/loggers.py:499
SGLANG = {"model_name": "m", "tp_rank": "0"}


def vllm_0_33(queries: int, gpu_hits: int, ext_queries: int, host_hits: int, prompt: int) -> str:
    """A vLLM 0.33.0 engine with the CPU offload tier (OffloadingConnector)."""
    reg = CollectorRegistry()
    labels = list(VLLM)

    def counter(name: str, doc: str, value: float, extra: dict[str, str] | None = None) -> None:
        c = Counter(name, doc, [*labels, *(extra or {})], registry=reg)
        c.labels(*VLLM.values(), *(extra or {}).values()).inc(value)

    Gauge(
        "vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=reg
    ).labels(*VLLM.values()).set(3)  # loggers.py:528
    Gauge(
        "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=reg
    ).labels(*VLLM.values()).set(0.5)  # loggers.py:620
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt)  # loggers.py:748
    counter(
        "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", queries
    )  # loggers.py:662
    counter(
        "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", gpu_hits
    )  # :673
    counter(  # loggers.py:686
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of "
        "queried tokens.",
        ext_queries,
    )
    counter(  # loggers.py:698
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of "
        "cached tokens.",
        host_hits,
    )
    # loggers.py:782, one series per CacheHitSource (vllm/v1/metrics/cache_hit_source.py:18-24); the CPU
    # offload manager's hits are `host` (vllm/v1/kv_offload/cpu/manager.py:211).
    by_source = Counter(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them.",
        [*labels, "source"],
        registry=reg,
    )
    for source, value in (
        ("device", gpu_hits),
        ("host", host_hits),
        ("p2p", 0),
        ("disk", 0),
        ("external_unspecified", 0),
    ):
        by_source.labels(*VLLM.values(), source).inc(value)
    Gauge(  # vllm/v1/kv_offload/cpu/common.py:14, documented in vllm/v1/kv_offload/cpu/spec.py:55
        "vllm:kv_offload_cpu_cache_usage_perc",
        "Fraction of CPU KV-cache space currently pinned by active transfers.",
        labels,
        registry=reg,
    ).labels(*VLLM.values()).set(0.25)
    # vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py:42 and :45
    counter("vllm:kv_offload_load_bytes", "Total bytes loaded from offload storage to GPU.", 4096)
    counter("vllm:kv_offload_store_bytes", "Total bytes stored from GPU to offload storage.", 8192)
    return generate_latest(reg).decode()


def sglang_0_5_23(prompt: int, device: int, host: int) -> str:
    """An SGLang 0.5.23 engine with HiCache (sglang/srt/observability/metrics_collector.py)."""
    reg = CollectorRegistry()
    labels = list(SGLANG)
    Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", labels, registry=reg).labels(
        *SGLANG.values()
    ).inc(prompt)  # :1856
    cached = Counter(  # :1935; sources reported at :2123-2133
        "sglang:cached_tokens_total",
        "Number of cached prompt tokens by source (device/host/storage).",
        [*labels, "cache_source"],
        registry=reg,
    )
    for source, value in (("device", device), ("host", host), ("total", 0)):
        cached.labels(*SGLANG.values(), source).inc(value)
    Gauge("sglang:hicache_host_used_tokens", "Host pool tokens used.", labels, registry=reg).labels(
        *SGLANG.values()
    ).set(100)  # :771
    Gauge("sglang:hicache_host_total_tokens", "Host pool capacity.", labels, registry=reg).labels(
        *SGLANG.values()
    ).set(400)  # :777
    Counter(  # :2535
        "sglang:evicted_tokens_total",
        "The number of device KV token slots freed by eviction.",
        labels,
        registry=reg,
    ).labels(*SGLANG.values()).inc(64)
    return generate_latest(reg).decode()


def test_vllm_0_33_cpu_tier_lookups_and_hits_are_read_from_its_connector_counters():
    dialect, values, sources = map_text_sources(vllm_0_33(1000, 600, 400, 300, 1000))
    assert dialect == "vllm"
    assert values["cpu_cache_queries_total"] == 400
    assert sources["cpu_cache_queries_total"] == "vllm:external_prefix_cache_queries"
    assert values["cpu_cache_hits_total"] == 300
    assert sources["cpu_cache_hits_total"] == "vllm:prompt_tokens_cached_by_source{source!=device}"
    assert values["cpu_kv_cache_usage"] == 0.25
    assert (
        values["offload_bytes_gpu_to_cpu_total"] == 8192 and values["offload_bytes_cpu_to_gpu_total"] == 4096
    )
    # vLLM 0.33.0 defines no block-level CPU-tier or eviction counter: nothing is read under those names.
    assert "kv_offload_cpu_block" not in " ".join(sources.values())
    assert sources["evicted_tokens_total"].startswith("absent: ")


def test_sglang_0_5_23_has_host_hits_but_no_host_lookups():
    _, values, sources = map_text_sources(sglang_0_5_23(prompt=1000, device=500, host=200))
    assert values["cpu_cache_hits_total"] == 200 and values["prefix_cache_hits_total"] == 500
    assert values["cpu_cache_queries_total"] is None
    assert sources["cpu_cache_queries_total"].startswith("absent: SGLang counts no lookups in its host pool")
    assert values["evicted_tokens_total"] == 64


def _delta(before: str, after: str) -> dict[str, float | None]:
    _, v0 = map_text(before)
    _, v1 = map_text(after)
    return {
        c: (None if v0.get(c) is None or v1.get(c) is None else float(v1[c] - v0[c]))  # type: ignore[operator]
        for c in COLUMNS[1:]
        if c.endswith("_total")
    }


def test_the_cpu_tier_hit_rate_is_the_engines_own_when_it_counts_lookups():
    figures = cpu_tier_figures(
        _delta(vllm_0_33(1000, 600, 400, 300, 1000), vllm_0_33(3000, 1600, 1400, 1000, 3000))
    )
    # 700 CPU hits of 1000 tokens looked up in the CPU tier (not of the 2000 prefix queries).
    assert figures == {"cpu_tier_hit_rate": pytest.approx(0.7), "cpu_tier_hit_source": READ_FROM_ENGINE}


def test_without_lookup_counts_the_rate_is_inferred_from_the_gpu_misses_and_says_so():
    figures = cpu_tier_figures(_delta(sglang_0_5_23(1000, 500, 200), sglang_0_5_23(2000, 900, 400)))
    # 200 host hits over 1000 - 400 = 600 tokens the GPU did not hold.
    assert figures == {"cpu_tier_hit_rate": pytest.approx(1 / 3), "cpu_tier_hit_source": INFERRED}
    assert cpu_tier_figures(dict.fromkeys(("cpu_cache_hits_total", "cpu_cache_queries_total"), None)) == {}


def test_the_window_figures_carry_the_rate_and_the_report_names_its_source(tmp_path: Path):
    csv = tmp_path / "server_metrics.csv"
    rows = [",".join(COLUMNS)]
    for t, text in ((0.0, vllm_0_33(0, 0, 0, 0, 0)), (10.0, vllm_0_33(2000, 1000, 1000, 250, 2000))):
        rows.append(",".join(format_row(t, map_text(text)[1])))
    csv.write_text("\n".join(rows) + "\n")
    figures, _ = window_figures(csv, 0.0, 10.0)
    assert figures["cpu_tier_hit_rate"] == pytest.approx(0.25)
    assert figures["cpu_tier_hit_source"] == READ_FROM_ENGINE
    assert figures["cpu_hit_rate"] == pytest.approx(0.125)  # of every queried token, as before
    frame = pd.DataFrame(
        [
            {"exp_name": "a", "status": "SUCCESS", "gpu_hit_rate": 0.5, **figures},
            {"exp_name": "b", "status": "SUCCESS", "cpu_tier_hit_rate": 0.4, "cpu_tier_hit_source": INFERRED},
            {"exp_name": "c", "status": "SUCCESS"},
        ]
    )
    rows_out = hit_rows(frame)
    assert rows_out[0][-2:] == ["25.0%", "engine counter"]
    assert rows_out[1][-2:] == ["40.0%", "inferred (GPU misses)"]
    assert rows_out[2][-1] == "-"
