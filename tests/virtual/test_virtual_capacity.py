"""A capacity cell on the virtual clock: every step a run of its own in the cell's process (a cold
prefix cache each time), each step a complete result directory, capacity.json and the tier lines as
on the wall clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agentsweep.contract.cell import CELL_ENV_VAR
from agentsweep.contract.resultdir import read_capacity, read_cell_record

pytestmark = pytest.mark.slow

STEP_FILES = ("cell.json", "status.txt", "requests.jsonl", "summary.json", "server_metrics.csv", "server.log",
              "replay.log")  # fmt: skip


def test_a_capacity_search_on_the_virtual_clock(repo_root: Path, tmp_path: Path) -> None:
    rd = tmp_path / "cap"
    cell = {
        "config_key": "cap", "exp_name": "cap-tp1-ep1-u1to4-off", "runner": "local", "engine": "sim",
        "hardware": "h200", "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "tp": 1,
        "users": 4, "offload": "off", "duration": 5, "speed": 50, "clock": "virtual",
        "traces": str(repo_root / "kv-cache-tester" / "sample_traces"), "max_context": 65536,
        "advance_max": 0.5, "engine_args": "--num-gpu-blocks-override 16000", "min_window_coverage": 0.5,
        "capacity": {"low": 1, "high": 4, "time_limit_min": 30, "tiers": [
            {"name": "roomy", "constraints": [{"metric": "ttft", "stat": "p90", "op": "<=", "value": 1000, "unit": "s"}]},
            {"name": "impossible", "constraints": [{"metric": "ttft", "stat": "p90", "op": "<=", "value": 0.001, "unit": "s"}]},
        ]},
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "RESULT_DIR", "PORT")}
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "cell"],
        env={**env, CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(rd)},
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "starting engine:" not in out and out.count("running in this process on a virtual clock") == 3
    assert "tier roomy (TTFT p90 ≤ 1,000 s): ≥ 4 agents per GPU" in out
    assert "tier impossible (TTFT p90 ≤ 0.001 s): 0 agents per GPU" in out
    record = read_capacity(rd)
    assert record is not None and record.stop_reason == "converged"
    assert [s.users for s in record.steps] == [1, 2, 4]
    for step in record.steps:
        sdir = rd / step.dir
        for name in STEP_FILES:
            assert (sdir / name).stat().st_size > 0, (step.dir, name)
        cell_record = read_cell_record(sdir)
        assert cell_record is not None and cell_record.status == step.status == "SUCCESS"
        assert "GPU KV cache size: 256,000 tokens" in (sdir / "server.log").read_text()
        records = [json.loads(line) for line in (sdir / "requests.jsonl").read_text().splitlines()]
        warmups = [r for r in records if r.get("phase") == "warmup"]
        assert warmups and all(r["cached_tokens"] == 0 for r in warmups), step.dir  # a cold cache
