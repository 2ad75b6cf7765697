"""Where every server_metrics.csv column comes from, and why a column is absent."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
from agentsweep.metrics.dialects import COLUMNS, map_text_sources
from agentsweep.metrics.scraper import Scraper

from tests.support import canned_server

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.prom")))
def test_every_column_has_a_source_or_a_reason(name):
    _, values, sources = map_text_sources((FIXTURES / name).read_text())
    assert set(sources) == set(COLUMNS[1:]) == set(values)
    for column in COLUMNS[1:]:
        absent = sources[column].startswith("absent: ")
        assert absent == (values[column] is None), (column, values[column], sources[column])
        assert len(sources[column]) > len("absent: ") + 5  # a metric name, or a reason in words


def test_current_vllm_on_a_cpu_maps_its_new_metrics():
    dialect, values, sources = map_text_sources((FIXTURES / "vllm_cpu_current.prom").read_text())
    assert dialect == "vllm"
    # waiting: only the by-reason gauge, summed over reasons
    assert values["requests_waiting"] == 4
    assert sources["requests_waiting"] == "vllm:num_requests_waiting_by_reason"
    # hits on the device from the per-source cached tokens (no prefix_cache_hits counter)
    assert values["prefix_cache_hits_total"] == 150000
    assert sources["prefix_cache_hits_total"] == "vllm:prompt_tokens_cached_by_source{source=device}"
    assert values["cpu_cache_hits_total"] == 0
    assert values["requests_finished_total"] == 40  # aborted requests left out
    # no CPU tier on a CPU engine: absent, with the reason
    for column in ("cpu_kv_cache_usage", "offload_bytes_gpu_to_cpu_total", "offload_bytes_cpu_to_gpu_total"):
        assert values[column] is None
        assert sources[column].startswith("absent: ") and "offload" in sources[column]


def test_the_prefix_hit_counter_wins_over_the_per_source_split():
    _, values, sources = map_text_sources((FIXTURES / "vllm_by_source.prom").read_text())
    assert sources["prefix_cache_hits_total"] == "vllm:prefix_cache_hits"
    assert values["prefix_cache_hits_total"] == 300000
    assert sources["requests_waiting"] == "vllm:num_requests_waiting"
    assert sources["cpu_cache_hits_total"] == "vllm:prompt_tokens_cached_by_source{source!=device}"


@pytest.mark.integration
def test_the_scraper_writes_the_sources_beside_the_csv(tmp_path):
    text = (FIXTURES / "vllm_cpu_current.prom").read_text()
    with canned_server() as server:
        server.serve([text])
        url = f"{server.url}/metrics"
        out = tmp_path / "server_metrics.csv"
        scraper = Scraper(url, out, interval=0.01, log=io.StringIO())
        threading.Timer(0.1, scraper.stop.set).start()
        scraper.run()
    data = json.loads((tmp_path / "server_metrics.sources.json").read_text())
    assert data["dialect"] == "vllm"
    assert data["columns"]["requests_waiting"] == "vllm:num_requests_waiting_by_reason"
    assert data["columns"]["cpu_kv_cache_usage"].startswith("absent: ")
    assert not list(tmp_path.glob("*.tmp"))
