"""The scraper CLI against the real simulated engine (both dialects), with real requests in between."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from agentsweep.metrics.dialects import COLUMNS

from tests.support import poll_until

pytestmark = pytest.mark.integration

PROMPT = " ".join(f"word{i}" for i in range(600))  # one word = one token in the simulated engine


def _complete(base: str) -> dict:
    body = json.dumps({"model": "sim-model", "prompt": PROMPT, "max_tokens": 8}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_scrape_simulated_engine(tmp_path, dialect, engine_sim_factory):
    out = tmp_path / "server_metrics.csv"
    flags = ("--dialect", dialect, "--speed", "50", "--num-gpu-blocks-override", "4096")
    with engine_sim_factory(*flags) as base:
        scraper = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentsweep.cli",
                "metrics-collector",
                "--endpoint",
                f"{base}/metrics",
                "--output",
                str(out),
                "--interval",
                "0.1",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            poll_until(lambda: len(_rows(out)) >= 2, timeout=20)
            for _ in range(3):  # the same prompt three times: the 2nd and 3rd hit the prefix cache
                _complete(base)
            time.sleep(0.4)
            scraper.send_signal(signal.SIGTERM)
            _, err = scraper.communicate(timeout=15)
        finally:
            if scraper.poll() is None:
                scraper.kill()
                scraper.wait()
    assert scraper.returncode == 0, err
    assert f"speaks the {dialect} dialect" in err
    rows = _rows(out)
    assert list(rows[0]) == list(COLUMNS) and len(rows) >= 3
    first, last = rows[0], rows[-1]
    assert float(last["prompt_tokens_total"]) - float(first["prompt_tokens_total"]) >= 3 * 600
    hits = float(last["prefix_cache_hits_total"]) - float(first["prefix_cache_hits_total"])
    queries = float(last["prefix_cache_queries_total"]) - float(first["prefix_cache_queries_total"])
    assert 0 < hits <= queries
    assert float(last["generation_tokens_total"]) >= 3
    assert all(r["kv_cache_usage"] != "" for r in rows)


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_evicted_tokens_count_the_cached_blocks_a_small_pool_gives_up(dialect, engine_sim_factory):
    """Five distinct 600-token prompts through a 100-block pool: the ones after the second take cached
    blocks (evictions, in whole blocks); the first two fit the empty pool and evict nothing."""
    from agentsweep.metrics.dialects import map_text_sources

    def evicted(base: str) -> tuple[float | None, str]:
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
            _, values, sources = map_text_sources(resp.read().decode())
        return values["evicted_tokens_total"], sources["evicted_tokens_total"]

    flags = ("--dialect", dialect, "--speed", "50", "--num-gpu-blocks-override", "100", "--block-size", "16")
    with engine_sim_factory(*flags) as base:
        counts = []
        for k in range(5):
            prompt = " ".join(f"p{k}w{i}" for i in range(600))
            body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 8}).encode()
            req = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert resp.status == 200
            counts.append(evicted(base))
    source = counts[0][1]
    assert source == ("engine_sim:evicted_tokens" if dialect == "vllm" else "sglang:evicted_tokens")
    values = [v for v, _ in counts]
    assert values[:2] == [0, 0]  # 2 x 38 blocks fit the empty pool of 100
    assert 0 < values[2] <= values[3] <= values[4] and all(v % 16 == 0 for v in values)  # type: ignore[operator]
    assert values[4] >= 2 * 600 - 16  # by then the pool has given up at least two prompts' worth
