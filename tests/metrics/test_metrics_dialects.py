"""Dialect mapping on real-format /metrics expositions of vLLM and SGLang (see fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentsweep.errors import InputError
from agentsweep.metrics.dialects import COLUMNS, format_row, map_text

FIXTURES = Path(__file__).parent / "fixtures"


def _map(name: str) -> tuple[str, dict]:
    return map_text((FIXTURES / name).read_text())


def test_vllm_recent_two_engines_summed_and_averaged():
    dialect, row = _map("vllm_recent_dp2_offload.prom")
    assert dialect == "vllm"
    assert row["requests_running"] == 8  # 5 + 3
    assert row["requests_waiting"] == 1
    assert row["kv_cache_usage"] == pytest.approx(0.375)  # mean of 0.5 and 0.25
    assert row["prefix_cache_queries_total"] == 500_000
    assert row["prefix_cache_hits_total"] == 300_000
    assert row["cpu_cache_hits_total"] == 80_000  # external_prefix_cache_hits, 60k + 20k
    assert row["prompt_tokens_total"] == 500_000
    assert row["generation_tokens_total"] == 40_000
    assert row["preemptions_total"] == 3
    assert row["offload_bytes_gpu_to_cpu_total"] == 1_048_576_000 + 209_715_200
    assert row["offload_bytes_cpu_to_gpu_total"] == 524_288_000 + 104_857_600
    assert row["cpu_kv_cache_usage"] is None  # not exposed: an empty cell, not a zero


def test_vllm_by_source_counter_wins_over_external():
    _, row = _map("vllm_by_source.prom")
    assert row["cpu_cache_hits_total"] == 80_000  # host only: 60k + 20k; device tokens excluded
    assert row["prefix_cache_hits_total"] == 300_000


def test_vllm_legacy_names():
    dialect, row = _map("vllm_legacy_gpu_names.prom")
    assert dialect == "vllm"
    assert row["kv_cache_usage"] == 0.75
    assert row["prefix_cache_queries_total"] == 80_000
    assert row["prefix_cache_hits_total"] == 20_000
    assert row["cpu_cache_hits_total"] is None
    assert row["offload_bytes_gpu_to_cpu_total"] is None


def test_sglang_hicache_sources_and_host_pool():
    dialect, row = _map("sglang_hicache.prom")
    assert dialect == "sglang"
    assert row["kv_cache_usage"] == pytest.approx(0.5)  # two TP ranks: 0.6 and 0.4
    assert row["cpu_kv_cache_usage"] == pytest.approx(0.25)  # 250k of 1M host tokens
    assert row["requests_running"] == 12
    assert row["prefix_cache_queries_total"] == 900_000
    assert row["prefix_cache_hits_total"] == 500_000  # cache_source="device"
    assert row["cpu_cache_hits_total"] == 150_000  # host (+ storage 0)
    assert row["preemptions_total"] == 3
    assert row["offload_bytes_gpu_to_cpu_total"] == 3_145_728_000
    assert row["offload_bytes_cpu_to_gpu_total"] == 1_572_864_000


def test_sglang_docs_example_without_cached_tokens():
    dialect, row = _map("sglang_docs_example.prom")
    assert dialect == "sglang"
    assert row["prompt_tokens_total"] == 8_128_902
    assert row["generation_tokens_total"] == 7_557_572
    assert row["kv_cache_usage"] == 0.28
    assert row["requests_running"] == 162
    assert row["requests_waiting"] == 2826
    assert row["prefix_cache_hits_total"] == 0  # counter not created before the first hit
    assert row["cpu_cache_hits_total"] is None
    assert row["preemptions_total"] is None


def test_counter_without_total_suffix_and_untyped_lines():
    text = "vllm:prefix_cache_queries 40\nvllm:prefix_cache_hits 30\nvllm:num_requests_running 2\n"
    _, row = map_text(text)
    assert (row["prefix_cache_queries_total"], row["prefix_cache_hits_total"]) == (40, 30)
    assert row["requests_running"] == 2


def test_unknown_dialect_is_an_input_error():
    with pytest.raises(InputError, match="neither vLLM"):
        map_text("# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n")


def test_format_row_leaves_missing_figures_empty():
    _, row = _map("vllm_legacy_gpu_names.prom")
    cells = dict(zip(COLUMNS, format_row(1700000000.5, row), strict=True))
    assert cells["time_s"] == "1700000000.500"
    assert cells["offload_bytes_cpu_to_gpu_total"] == ""
    assert cells["prefix_cache_hits_total"] == "20000"
    assert cells["kv_cache_usage"] == "0.75"


def test_sglang_cached_tokens_without_a_source_split_count_as_device_hits():
    # SGLang 0.5.23 labels a request's hits cache_source="total" when it has no per-source split
    # (observability/metrics_collector.py); they are not hits from host memory.
    text = """\
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 1000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 300.0
sglang:cached_tokens_total{cache_source="total",model_name="m"} 200.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 100.0
sglang:cached_tokens_total{cache_source="storage",model_name="m"} 50.0
"""
    _, row = map_text(text)
    assert row["prefix_cache_hits_total"] == 500.0
    assert row["cpu_cache_hits_total"] == 150.0
