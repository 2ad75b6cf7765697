"""benchmarks/run_cell.sh end to end with the simulated engine, the real scraper and the real replayer."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from agentsweep.contract.cell import CELL_ENV_VAR
from agentsweep.contract.resultdir import result_file

pytestmark = pytest.mark.slow


def _cell_env(repo_root: Path, result_dir: Path, **over: object) -> dict[str, str]:
    cell = {
        "config_key": "e2e",
        "exp_name": "e2e-tp1-ep1-u2-off",
        "runner": "local",
        "engine": "sim",
        "hardware": "h200",
        "model": "meta-llama/Llama-3.3-70B-Instruct",
        "precision": "fp8",
        "tp": 1,
        "users": 2,
        "offload": "off",
        "duration": 4,
        "traces": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "max_context": 65536,
        "max_delay": 1,  # short think times: a 4 s window of 2 users stays busy (window coverage)
        # What this test checks is not run validity: room for a CI machine busy with other tests.
        "min_window_coverage": 0.5,
        "max_dispatch_lag_p99_s": 2.0,
        "warmup_requests": 0,
        "speed": 50,
        "engine_args": "--num-gpu-blocks-override 4096",
        "engine_env": {"HF_TOKEN": "do-not-leak"},
    }
    skip = (CELL_ENV_VAR, "PORT", "RESULT_DIR")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    return {**env, CELL_ENV_VAR: json.dumps({**cell, **over}), "RESULT_DIR": str(result_dir)}


def _run(repo_root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_sim_cell_succeeds_with_every_result_file(repo_root, tmp_path):
    rd = tmp_path / "cell"
    proc = _run(repo_root, _cell_env(repo_root, rd))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (rd / "status.txt").read_text() == "SUCCESS\n"
    for name in (
        "cell.json",
        "requests.jsonl",
        "summary.json",
        "server_metrics.csv",
        "server.log",
        "replay.log",
    ):
        assert (rd / name).stat().st_size > 0, name
    record = json.loads((rd / "cell.json").read_text())
    assert record["status"] == "SUCCESS"
    assert record["engine_env"] == {"HF_TOKEN": "***"}
    assert "do-not-leak" not in (rd / "cell.json").read_text()
    assert record["engine_command"][3] == "engine-sim"
    assert json.loads((rd / "summary.json").read_text())["counts"]["ok"] > 0
    assert len((rd / "server_metrics.csv").read_text().splitlines()) >= 3  # header + scrapes
    for path in rd.iterdir():  # every file the cell left is declared by the result directory's owner
        result_file(path.name)


def test_engine_crash_mid_run_leaves_a_failed_cell_with_complete_requests(repo_root, tmp_path):
    rd = tmp_path / "cell"
    env = _cell_env(repo_root, rd, engine_args="--num-gpu-blocks-override 4096 --crash-after 6", duration=30)
    start = time.monotonic()
    proc = _run(repo_root, env)
    assert time.monotonic() - start < 60
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = (rd / "status.txt").read_text().splitlines()
    assert lines[0] == "FAILED"
    assert lines[1].startswith("engine exited with status"), lines
    # Every line is a complete record: the requests that finished before the crash, then the cut ones.
    records = [json.loads(line) for line in (rd / "requests.jsonl").read_text().splitlines()]
    assert records[0]["status"] == "ok" and records[-1]["status"] == "error"
    assert sum(r["status"] == "ok" for r in records) >= 6 - 2  # crash at request 7; 2 users in flight
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["counts"]["sent"] == len(records)
