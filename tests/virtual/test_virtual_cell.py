"""A simulated cell with ``clock: virtual``, run as every cell is (benchmarks/run_cell.sh): the same
verdict and figures as the same cell over HTTP on the wall clock, its files whole when SIGTERM stops
it, and the cells it cannot run refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR, Cell
from agentsweep.errors import InputError

from tests.support import CLIENT_ROOM, wait_for_file

pytestmark = pytest.mark.slow

CELL = {
    "config_key": "vt", "runner": "local", "engine": "sim", "hardware": "h200",
    "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "tp": 1, "users": 4, "offload": "off",
    "duration": 10, "speed": 50, "max_context": 24576, "engine_args": "--num-gpu-blocks-override 9984",
    "power_source": "dcgm", "power_endpoint": "engine",
    **CLIENT_ROOM,  # the wall-clock twin shares two cores with the rest of the suite
}  # fmt: skip
# What the two clocks must agree on, and how closely: within the wall clock's own run-to-run spread
# on the demo grid (scripts/bench_virtual.py: up to 13% on throughput, 31% on TTFT p50; its tails
# spread further, so no p90 of TTFT is compared). A wrong clock, speed or batching is off by far more.
FIGURES = {"output_tok_per_s_per_gpu": 0.15, "total_tok_per_s_per_gpu": 0.15, "gpu_hit_rate": 0.10,
           "ttft_p50_s": 0.30, "interactivity_p90_tok_per_s": 0.30}  # fmt: skip


def start(repo_root: Path, result_dir: Path, clock: str, **over: object) -> subprocess.Popen[str]:
    cell = {**CELL, "exp_name": f"vt-{clock}", "clock": clock,
            "traces": str(repo_root / "kv-cache-tester" / "sample_traces"), **over}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    env |= {CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(result_dir)}
    return subprocess.Popen(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_virtual_clock_gives_the_wall_clocks_verdict_and_figures(repo_root: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    logs = {}
    for clock in ("wall", "virtual"):  # one after the other: the wall clock's cell gets the CPU it needs
        proc = start(repo_root, results / f"vt-{clock}", clock)
        logs[clock] = proc.communicate(timeout=180)[0]
        assert proc.returncode == 0, logs[clock][-3000:]
    assert "running in this process on a virtual clock" in logs["virtual"]
    assert main(["collect", str(results), str(tmp_path / "out"), "--no-plots"]) == 0
    df = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("exp_name")
    wall, virtual = df.loc["vt-wall"], df.loc["vt-virtual"]
    assert wall["status"] == virtual["status"] == "SUCCESS"
    for name, tolerance in FIGURES.items():
        assert virtual[name] == pytest.approx(wall[name], rel=tolerance), name
    cell = json.loads((results / "vt-virtual" / "cell.json").read_text())
    assert cell["cell"]["clock"] == "virtual"
    assert (results / "vt-virtual" / "power.csv").stat().st_size > 0


def test_sigterm_stops_it_with_every_file_whole(repo_root: Path, tmp_path: Path) -> None:
    result_dir = tmp_path / "long"
    proc = start(repo_root, result_dir, "virtual", duration=600, users=8)
    wait_for_file(result_dir / "requests.jsonl", timeout=60)
    time.sleep(1.0)  # some requests recorded
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, out[-2000:]
    status = (result_dir / "status.txt").read_text().splitlines()
    assert status[0] == "FAILED" and "interrupted by SIGTERM" in status[1], status
    records = [json.loads(line) for line in (result_dir / "requests.jsonl").read_text().splitlines()]
    summary = json.loads((result_dir / "summary.json").read_text())
    counts = summary["counts"]
    assert records and len(records) == counts["ok"] + counts["failed"] + counts["warmup"]
    assert (result_dir / "cell.json").exists()


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"engine": "vllm", "speed": 1.0}, "clock: virtual runs the simulated engine only"),
        (
            {"replicas": 2, "router": "cache_aware"},
            "router: cache_aware .the router program's own state. needs clock: wall",
        ),
        ({"client_nodes": 2}, "client_nodes > 1 needs clock: wall"),
    ],
)
def test_cells_it_cannot_run_are_refused_in_one_line(over: dict[str, object], message: str) -> None:
    cell = {**CELL, "exp_name": "x", "traces": "t", "clock": "virtual", **over}
    with pytest.raises(InputError, match=message) as err:
        Cell.parse(cell)
    assert "\n" not in str(err.value)
