"""Real cells on the simulated engine with injected faults: a broken run never reads as SUCCESS."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from agentsweep.contract.cell import CELL_ENV_VAR

pytestmark = pytest.mark.slow


def _run(repo_root: Path, result_dir: Path, engine_args: str) -> tuple[str, list[str], dict]:
    cell = {
        "config_key": "faults",
        "exp_name": result_dir.name,
        "engine": "sim",
        "hardware": "h200",
        "model": "meta-llama/Llama-3.3-70B-Instruct",
        "precision": "fp8",
        "tp": 1,
        "users": 2,
        "offload": "off",
        "duration": 8,
        "traces": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "max_context": 131072,
        "speed": 50,
        "engine_args": engine_args,
        # Room for a CI machine busy with other tests; the faults fail on failed_share regardless.
        "min_window_coverage": 0.8,
        "max_dispatch_lag_p99_s": 1.0,
    }
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    env |= {CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(result_dir)}
    proc = subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = (result_dir / "status.txt").read_text().splitlines()
    summary = json.loads((result_dir / "summary.json").read_text())
    assert proc.returncode == (0 if lines[0] == "SUCCESS" else 1), proc.stdout + proc.stderr
    return lines[0], lines[1:], summary["validity"]


def test_injected_faults_are_invalid_and_a_healthy_cell_succeeds(repo_root, tmp_path):
    cases = {
        "healthy": "",
        "fail-after": "--fail-after 6",
        "fail-rate": "--fail-rate 0.2",
        "stall-after": "--stall-after 6",
    }
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_run, repo_root, tmp_path / name, args) for name, args in cases.items()}
        results = {name: future.result() for name, future in futures.items()}
    status, reasons, validity = results["healthy"]
    assert (status, reasons, validity["valid"]) == ("SUCCESS", [], True), reasons
    for name in ("fail-after", "fail-rate", "stall-after"):
        status, reasons, validity = results[name]
        assert status == "INVALID" and validity["valid"] is False, name
        assert any(r.startswith("failed_share: ") for r in reasons), (name, reasons)
        assert reasons == validity["reasons"]
    # A stalled engine also leaves the window uncovered.
    assert any(r.startswith("window_coverage: ") for r in results["stall-after"][1])
