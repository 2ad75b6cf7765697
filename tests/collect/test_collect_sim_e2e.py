"""collect on a real local run: benchmarks/run_cell.sh with the simulated engine, scraper and replayer."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR

pytestmark = pytest.mark.slow
USERS = 2
MAX_CONTEXT = 65536


def _run_cell(repo_root: Path, results: Path, users: int, offload: str) -> None:
    exp = f"e2e-tp1-ep1-u{users}-{offload}"
    cell = {
        "config_key": "e2e",
        "exp_name": exp,
        "runner": "local",
        "engine": "sim",
        "hardware": "h200",
        "model": "meta-llama/Llama-3.3-70B-Instruct",
        "precision": "fp8",
        "tp": 1,
        "users": users,
        "offload": offload,
        "duration": 4,
        "traces": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "max_context": MAX_CONTEXT,
        "max_delay": 1,  # short think times: a 4 s window of 2 users stays busy (window coverage)
        # What this test checks is not run validity: room for a CI machine busy with other tests.
        "min_window_coverage": 0.5,
        "min_window_requests": 1,  # a 4 s window of 2 users finishes a handful
        "max_dispatch_lag_p99_s": 2.0,
        "warmup_requests": 0,
        "speed": 50,
        "engine_args": "--num-gpu-blocks-override 4096",
    }
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    proc = subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "30"],
        env={**env, CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(results / "e2e" / exp)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _last_scrape(path: Path) -> dict[str, str]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))[-1]


def test_collect_real_simulated_cells(repo_root, tmp_path):
    results = tmp_path / "results"
    # The two cells are independent (own port, own result dir): run them side by side.
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(_run_cell, repo_root, results, USERS, mode) for mode in ("off", "noprefix")]
        for run in runs:
            run.result()
    out = results / "e2e" / "aggregated"
    assert main(["collect", str(results / "e2e"), str(out), "--no-plots"]) == 0
    df = pd.read_csv(out / "summary.csv").set_index("offload")
    assert list(df["status"]) == ["SUCCESS", "SUCCESS"]
    off, noprefix = df.loc["off"], df.loc["noprefix"]
    for row in (off, noprefix):
        assert row["server_rows_in_window"] >= 2
        assert row["output_tok_per_s_per_gpu"] > 0 and row["ttft_p50_s"] > 0
        assert row["req_profile_ok"] > 0 and 0 < row["theoretical_hit_rate"] <= 1
        assert pd.isna(row["notes"])
    # Agentic traces reuse their prefixes: the engine's cache hits them unless caching is off.
    assert 0 < off["gpu_hit_rate"] <= 1
    assert off["req_client_hit_rate"] > 0
    # With caching off the engine queries nothing: no rate (empty), never a made-up one; and the
    # clients are told of no cached token.
    assert pd.isna(noprefix["gpu_hit_rate"]) and pd.isna(noprefix["cpu_hit_rate"])
    assert noprefix["req_client_hit_rate"] == 0 and noprefix["req_prompt_tokens"] > 0
    assert off["gpu_hit_rate"] <= off["theoretical_hit_rate"] + 1e-9
    # Each request is one prefix-cache query of its prompt (a preempted request's re-lookups are not
    # exported, as in vLLM); only requests cut off before their first token add queries without
    # prompt tokens, at most one per user. This once read ~2x the prompt tokens.
    last = _last_scrape(results / "e2e" / "e2e-tp1-ep1-u2-off" / "server_metrics.csv")
    queries, prompt = float(last["prefix_cache_queries_total"]), float(last["prompt_tokens_total"])
    assert prompt <= queries <= prompt + USERS * MAX_CONTEXT, (queries, prompt)
