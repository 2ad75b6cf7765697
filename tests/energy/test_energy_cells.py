"""The whole path on the simulated engine: a cell samples its simulated GPUs' DCGM metrics beside the
engines (one engine, replicas behind a router, prefill/decode), and its power summary holds energy and
joules per token; nothing of the sampler is left once the cell has ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agentsweep.contract.resultdir import read_status, result_file
from agentsweep.energy.powercsv import read_power
from agentsweep.energy.summary import integrate, power_summary
from agentsweep.engine_sim.profiles import HARDWARE

from tests.support import wait_until

pytestmark = pytest.mark.slow

MODEL = "meta-llama/Llama-3.3-70B-Instruct"
BASE: dict[str, Any] = {
    "config_key": "pw", "runner": "local", "engine": "sim", "hardware": "h200", "model": MODEL, "precision": "fp8", "users": 4,
    "offload": "off", "duration": 8, "max_context": 65536, "max_delay": 1, "warmup_requests": 0, "speed": 50,
    "engine_args": "--num-gpu-blocks-override 8192", "power_source": "dcgm", "power_endpoint": "engine",
    "power_interval_s": 0.25,
    # What these tests check is the power path, not run validity: room for a machine busy with others.
    "max_throughput_drift": 5.0, "min_window_coverage": 0.5, "max_dispatch_lag_p99_s": 2.0,
    # A lane idle 17 engine seconds is 0.34 s of a client starved at speed 50 (seen in a full run).
    "max_lane_idle_s": 60.0,
}  # fmt: skip
SHAPES = {
    "one engine, tp 2": ({"exp_name": "pw-tp2-ep1-u4-off", "tp": 2}, ["0", "1"]),
    "two replicas": (
        {"exp_name": "pw-tp1-ep1-u4-off-r2-round_robin", "tp": 1, "replicas": 2, "router": "round_robin",
         "router_program": "vllm-router"},
        ["r0/0", "r1/0"],
    ),
    "prefill/decode": (
        {"exp_name": "pw-tp1-ep1-u4-off-p1x1-d1x1-round_robin", "tp": 1, "router": "round_robin",
         "router_program": "smg", "prefill": {"replicas": 1, "tp": 1}, "decode": {"replicas": 1, "tp": 1}},
        ["p0/0", "d0/0"],
    ),
}  # fmt: skip


def run_cell(repo_root: Path, rd: Path, fields: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    cell = {**BASE, "traces": str(repo_root / "kv-cache-tester" / "sample_traces"), **fields}
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSWEEP_CELL", "PORT", "RESULT_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "cell", "--cell", json.dumps(cell), "--result-dir", str(rd),
         "--health-timeout", "60"],
        env=env, capture_output=True, text=True, timeout=240, cwd=repo_root,
    )  # fmt: skip


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_simulated_cell_has_energy_figures(repo_root: Path, tmp_path: Path, shape: str):
    fields, gpus = SHAPES[shape]
    rd = tmp_path / "cell"
    proc = run_cell(repo_root, rd, fields)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = read_status(rd)
    assert status is not None and status.verdict == "SUCCESS", status
    assert "J per output token" in proc.stdout  # the cell says its power figures
    for path in rd.iterdir():
        result_file(path.name)

    rows = read_power(rd / "power.csv")
    assert [r.fault for r in rows if r.fault] == []
    assert sorted({r.gpu for r in rows}) == sorted(gpus)
    summary = power_summary(rd)
    assert summary.power_valid, summary.reasons
    audit = summary.audit
    assert audit.expected_gpus == audit.observed_gpus == len(gpus)
    assert audit.source == "dcgm (simulated engine)" and audit.energy_from == "counter"
    assert audit.clock_scale == 50 and audit.largest_gap_s is not None and audit.largest_gap_s < 2.0
    h200 = HARDWARE["h200"]
    for gpu in summary.per_gpu:  # every simulated GPU draws at least idle power and at most its board's
        assert h200.idle_power_w - 1e-6 <= (gpu.avg_power_w or 0) <= h200.board_power_w + 1e-6, gpu
    assert (summary.avg_power_w or 0) > h200.idle_power_w * len(gpus)  # it worked in the window
    assert (
        summary.joules_per_output_token
        and summary.joules_per_total_token
        and summary.joules_per_successful_query
    )
    assert summary.joules_per_output_token > summary.joules_per_total_token
    assert summary.avg_temp_c and summary.peak_temp_c and summary.avg_util_pct is not None

    # The counter and the integral of the sampled power (in the engine's clock) agree: the simulated
    # GPU's DCGM power and energy come from one model.
    start, end = audit.window_start_unix, audit.window_end_unix
    assert start is not None and end is not None
    for gpu in summary.per_gpu:
        mine = [r for r in rows if r.gpu == gpu.gpu and r.power_w is not None]
        integral = integrate([r.time_s for r in mine], [r.power_w or 0.0 for r in mine], start, end) * 50
        assert integral == pytest.approx(gpu.energy_j, rel=0.15), gpu

    left = subprocess.run(["pgrep", "-f", f"power-sampler.*{rd}"], capture_output=True, text=True)
    assert left.stdout.strip() == "", "the power sampler outlived its cell"


def test_a_cell_whose_power_sampler_dies_is_still_a_valid_point(repo_root: Path, tmp_path: Path):
    """The sampler killed part way: the cell runs on to SUCCESS with its performance figures, and only
    its power figures are withheld, with the gap that killing left as the reason."""
    rd = tmp_path / "cell"
    cell = {**BASE, "traces": str(repo_root / "kv-cache-tester" / "sample_traces"), "exp_name": "pw-tp1-ep1-u4-off",
            "tp": 1, "duration": 10}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSWEEP_CELL", "PORT", "RESULT_DIR")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", "cell", "--cell", json.dumps(cell), "--result-dir", str(rd)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=repo_root,
    )  # fmt: skip
    try:
        wait_until(
            lambda: (rd / "summary.json").exists() is False and len(_lines(rd / "power.csv")) > 12,
            timeout=90, what="power samples", process=proc,
        )  # fmt: skip
        sampler = subprocess.run(["pgrep", "-f", f"power-sampler.*{rd}"], capture_output=True, text=True)
        pids = [int(p) for p in sampler.stdout.split()]
        assert len(pids) == 1, sampler.stdout
        os.kill(pids[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    assert "power sampler exited early with status -9" in out
    status = read_status(rd)
    assert status is not None and status.verdict == "SUCCESS", status
    summary = power_summary(rd)
    assert not summary.power_valid and summary.total_gpu_energy_j is None
    assert any("largest gap between power samples" in r for r in summary.reasons), summary.reasons
    assert summary.audit.samples > 0 and summary.audit.expected_gpus == 1


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
