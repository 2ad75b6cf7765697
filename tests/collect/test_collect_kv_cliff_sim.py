"""The KV-capacity cliff on the simulated engine: past it the GPU hit rate collapses and TTFT jumps.

Two real cells on agentic traces, the same 8 users, the same engine, one with a KV pool larger than
the users' live context and one with a pool far smaller: the small one's GPU hits fall well below
the traces' theoretical reuse while the large one's match it, its TTFT is several times longer, and
collect flags it past the cliff.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR

from tests.support import CLIENT_ROOM

pytestmark = pytest.mark.slow


def _run(repo_root: Path, results: Path, name: str, blocks: int) -> None:
    cell = {
        "config_key": "cliff",
        "exp_name": name,
        "engine": "sim",
        "hardware": "h200",
        "model": "meta-llama/Llama-3.3-70B-Instruct",
        "precision": "fp8",
        "tp": 1,
        "users": 8,
        "offload": "off",
        "duration": 12,
        "traces": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "max_context": 24576,
        "speed": 50,
        "engine_args": f"--num-gpu-blocks-override {blocks}",
        # The big pool must be SUCCESS: room for a client starved by the tests beside it.
        **CLIENT_ROOM,
    }
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    env |= {CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(results / name)}
    subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_past_the_cliff_hits_collapse_and_ttft_jumps(repo_root, tmp_path):
    results = tmp_path / "cliff"
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(_run, repo_root, results, "big-pool", 40_000),  # 640k tokens
            pool.submit(_run, repo_root, results, "small-pool", 4_000),  # 64k tokens
        ]
        for run in runs:
            run.result()
    out = tmp_path / "aggregated"
    main(["collect", str(results), str(out), "--no-plots"])
    df = pd.read_csv(out / "summary.csv").set_index("exp_name")
    big, small = df.loc["big-pool"], df.loc["small-pool"]
    assert big["status"] == "SUCCESS", big["reason"]
    assert big["past_kv_cliff"] == 0 and small["past_kv_cliff"] == 1
    assert small["kv_working_set_tokens"] > small["kv_pool_tokens"] == 64_000
    # Under the cliff the engine hits nearly all the reuse the traces hold; past it, far less.
    assert big["gpu_hit_rate"] > 0.9 * big["theoretical_hit_rate"]
    assert small["gpu_hit_rate"] < 0.6 * small["theoretical_hit_rate"]
    # Every turn recomputes its evicted context: time to first token jumps.
    assert small["ttft_p50_s"] > 2 * big["ttft_p50_s"]
