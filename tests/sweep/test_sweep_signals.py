"""A sweep and every process it starts die together: SIGTERM and SIGKILL to `agentsweep sweep` mid-cell.

Real cells (simulated engine, real launcher, scraper and replayer). Every process the test starts
carries a marker in its environment, so what is left afterwards is found by listing /proc, whatever
session or process group it moved to.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import poll_until

pytestmark = pytest.mark.slow

FIRST = "demo-mini-tp1-ep1-u2-on"


def _start_sweep(repo_root: Path, results: Path, marker: dict[str, str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSWEEP_CELL", "RESULT_DIR", "PORT")}
    cmd = [sys.executable, "-m", "agentsweep.cli", "sweep", "--key", "demo-mini", "--results", str(results)]
    cmd.append("--no-plots")  # what is collected is checked, not how it is drawn
    return subprocess.Popen(
        [*cmd, "--duration", "60"],
        cwd=repo_root,
        env={**env, **marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_replay(rd: Path, proc: subprocess.Popen[str]) -> None:
    requests = rd / "requests.jsonl"
    poll_until(
        lambda: requests.exists() and requests.stat().st_size > 0,
        timeout=30,
        interval=0.1,
        process=proc,
        what="the first cell's replay",
    )
    assert requests.exists(), "the first cell's replay never started"


def _cleanup(proc: subprocess.Popen[str], kill_tree: Callable[[], None]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    kill_tree()


def test_sigterm_stops_the_running_cell_cleanly_and_says_how_to_resume(repo_root, tmp_path, process_tree):
    results = tmp_path / "results"
    key_dir = results / "demo-mini"
    proc = _start_sweep(repo_root, results, process_tree.env)
    try:
        _wait_for_replay(key_dir / FIRST, proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        left = process_tree.wait_until_gone(2.0)
    finally:
        _cleanup(proc, process_tree.kill)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert not left, f"left running after the sweep stopped: {left}\n{out}"
    assert (key_dir / FIRST / "status.txt").read_text() == "FAILED\ninterrupted by SIGTERM\n"
    assert sorted(p.name for p in key_dir.iterdir()) == ["aggregated", FIRST]  # no later cell ran
    assert f"sweep: SIGTERM: stopping {FIRST}" in out
    assert f"sweep: [1/3] {FIRST} interrupted (SIGTERM)" in out
    assert "sweep: interrupted by SIGTERM; 3 cell(s) left: rerun the same command with --resume" in out
    assert (key_dir / "aggregated" / "summary.csv").exists()  # what there is still gets collected


def test_ctrl_c_reaches_the_cell_as_sigint_and_its_verdict_says_so(repo_root, tmp_path, process_tree):
    results = tmp_path / "results"
    rd = results / "demo-mini" / FIRST
    proc = _start_sweep(repo_root, results, process_tree.env)
    try:
        _wait_for_replay(rd, proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        left = process_tree.wait_until_gone(2.0)
    finally:
        _cleanup(proc, process_tree.kill)
    assert proc.returncode == 128 + signal.SIGINT, out
    assert not left, f"left running after the sweep stopped: {left}\n{out}"
    assert (rd / "status.txt").read_text() == "FAILED\ninterrupted by SIGINT\n"
    assert f"sweep: SIGINT: stopping {FIRST} (SIGINT, up to" in out


def test_sigkill_to_the_sweep_still_stops_the_cell_with_its_verdict(repo_root, tmp_path, process_tree):
    results = tmp_path / "results"
    rd = results / "demo-mini" / FIRST
    proc = _start_sweep(repo_root, results, process_tree.env)
    try:
        _wait_for_replay(rd, proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        # The launcher gets SIGTERM when the sweep dies; the cell stops its children and writes its verdict.
        left = process_tree.wait_until_gone(20.0)
    finally:
        _cleanup(proc, process_tree.kill)
    assert not left, f"left running after the sweep was killed: {left}"
    assert (rd / "status.txt").read_text() == "FAILED\ninterrupted by SIGTERM\n"
