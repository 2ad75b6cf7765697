"""A cell and every process it starts die together: `agentsweep cell` killed with SIGKILL mid-replay.

Every process the test starts carries a marker in its environment (children inherit it), so what is
left afterwards is found by listing /proc, whatever session or process group it moved to.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from agentsweep.cell.placement import free_port
from agentsweep.contract.cell import CELL_ENV_VAR

from tests.support import poll_until

pytestmark = pytest.mark.slow


def _cell_env(repo_root: Path, rd: Path, marker: dict[str, str]) -> dict[str, str]:
    cell = {
        "config_key": "tree",
        "exp_name": "tree-tp1-ep1-u2-off",
        "runner": "local",
        "engine": "sim",
        "hardware": "h200",
        "model": "m",
        "precision": "fp8",
        "tp": 1,
        "users": 2,
        "offload": "off",
        "duration": 60,
        "traces": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "max_context": 65536,
        "max_delay": 1,
        "warmup_requests": 0,
        "speed": 50,
    }
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "RESULT_DIR", "PORT")}
    return {
        **env,
        CELL_ENV_VAR: json.dumps(cell),
        "RESULT_DIR": str(rd),
        "PORT": str(free_port()),
        **marker,
    }


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def test_sigkill_to_the_cell_process_stops_its_whole_tree_before_the_verdict(
    repo_root, tmp_path, process_tree
):
    rd = tmp_path / "cell"
    proc = subprocess.Popen(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "30"],
        env=_cell_env(repo_root, rd, process_tree.env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        requests = rd / "requests.jsonl"
        poll_until(lambda: requests.exists() and requests.stat().st_size > 0, timeout=30, interval=0.1)
        assert requests.exists(), "the replay never started"
        started = process_tree.marked()
        # run_cell.sh, the cell, engine, scraper, replayer, watchdog
        assert len(started) >= 6, started
        cell = [p for p in _children(proc.pid) if "agentsweep.cli cell" in started.get(p, "")]
        assert len(cell) == 1, started
        os.kill(cell[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 137, out
        # Nothing of the cell is left (run_cell.sh waited for the watchdog before writing the verdict).
        left = process_tree.wait_until_gone(1.0)
        assert not left, f"left running after the cell was killed: {left}\n{out}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        process_tree.kill()
    status = rd / "status.txt"
    assert (
        status.read_text() == "FAILED\nthe cell process exited with status 137 without writing its result\n"
    )
    # The verdict is the last write into the directory, and stays so.
    sizes = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in rd.iterdir()}
    assert max(mtime for mtime, _ in sizes.values()) <= status.stat().st_mtime_ns, sizes
    time.sleep(1.5)
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in rd.iterdir()} == sizes
    # The replayer was stopped with SIGTERM, not killed: its records are complete lines.
    for line in requests.read_text().splitlines():
        json.loads(line)
