"""benchmarks/run_cell.sh end to end with the simulated engine, the real scraper and the real replayer."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _cell_env(repo_root: Path, result_dir: Path, **over: str) -> dict[str, str]:
    cell = {
        "CONFIG_KEY": "e2e",
        "EXP_NAME": "e2e-tp1-ep1-u2-off",
        "RUNNER": "local",
        "ENGINE": "sim",
        "MODEL": "meta-llama/Llama-3.3-70B-Instruct",
        "PRECISION": "fp8",
        "TP": "1",
        "USERS": "2",
        "OFFLOAD": "off",
        "DURATION": "4",
        "TRACES": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "MAX_CONTEXT": "65536",
        "WARMUP_REQUESTS": "0",
        "SPEED": "50",
        "ENGINE_ARGS": "--num-gpu-blocks-override 4096",
        "ENGINE_ENV": '{"HF_TOKEN": "do-not-leak"}',
    }
    env = {k: v for k, v in os.environ.items() if k.upper() not in cell and k not in ("PORT", "RESULT_DIR")}
    return {**env, **cell, **over, "RESULT_DIR": str(result_dir)}


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


def test_engine_crash_mid_run_leaves_a_failed_cell_with_complete_requests(repo_root, tmp_path):
    rd = tmp_path / "cell"
    env = _cell_env(
        repo_root, rd, ENGINE_ARGS="--num-gpu-blocks-override 4096 --crash-after 6", DURATION="30"
    )
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
