"""Replay real sample traces against the simulated engine (`agentsweep engine-sim`, a subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SIM = Path(sys.executable).parent / "agentsweep"


@pytest.fixture
def engine_sim(engine_sim_factory) -> Iterator[str]:
    with engine_sim_factory("--speed", "200") as url:
        yield url


@pytest.mark.slow
def test_replay_sample_traces_against_engine_sim(tmp_path, engine_sim, sample_traces, repo_root):
    traces = tmp_path / "traces"
    traces.mkdir()
    for name in ("trace_0504.json", "trace_0021.json", "trace_0058.json"):
        shutil.copy(sample_traces / name, traces / name)
    out = tmp_path / "out"
    cmd = [
        sys.executable, str(repo_root / "kv-cache-tester" / "trace_replay_tester.py"),
        "--api-endpoint", engine_sim, "--trace-directory", str(traces), "--output-dir", str(out),
        "--max-users", "3", "--time-scale", "0.001", "--max-context", "40000", "--no-color",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    recs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert recs and all(r["status"] == "ok" for r in recs), recs[:2]
    # words mode: the engine counts exactly our tokens plus its fixed chat-template overhead
    overheads = {r["prompt_tokens"] - r["expected_prompt_tokens"] for r in recs}
    assert len(overheads) == 1 and 0 <= overheads.pop() < 64
    assert all(r["prompt_tokens_source"] == "server" and r["cached_tokens"] is not None for r in recs)
    summ = json.loads((out / "summary.json").read_text())
    # the engine's cache really holds the shared prefixes: it hits about as much as an infinite cache
    assert summ["cache"]["client_hit_rate"] > 0.5
    assert abs(summ["cache"]["client_hit_rate"] - summ["cache"]["theoretical_hit_rate"]) < 0.1
    assert (out / "ttft_throughput.png").stat().st_size > 0
