"""A sweep and every process it starts die together: SIGTERM and SIGKILL to `agentsweep sweep` mid-cell.

Real cells (simulated engine, real launcher, scraper and replayer). Every process the test starts
carries a marker in its environment, so what is left afterwards is found by listing /proc, whatever
session or process group it moved to.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MARKER = "AGENTSWEEP_TEST_TREE"
FIRST = "demo-mini-tp1-ep1-u2-on"


def marked(tag: str) -> dict[int, str]:
    """pid -> command line of every live (non-zombie) process whose environment holds MARKER=tag."""
    found: dict[int, str] = {}
    needle = f"{MARKER}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if "\nState:\tZ" in (entry / "status").read_text():
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return found


def wait_until_gone(tag: str, seconds: float) -> dict[int, str]:
    deadline = time.monotonic() + seconds
    left = marked(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked(tag)
    return left


def _start_sweep(repo_root: Path, results: Path, tag: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSWEEP_CELL", "RESULT_DIR", "PORT")}
    cmd = [sys.executable, "-m", "agentsweep.cli", "sweep", "--key", "demo-mini", "--results", str(results)]
    return subprocess.Popen(
        [*cmd, "--duration", "60"],
        cwd=repo_root,
        env={**env, MARKER: tag},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_replay(rd: Path, proc: subprocess.Popen[str]) -> None:
    requests = rd / "requests.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (requests.exists() and requests.stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    assert requests.exists(), "the first cell's replay never started"


def _cleanup(proc: subprocess.Popen[str], tag: str) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in marked(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_the_running_cell_cleanly_and_says_how_to_resume(repo_root, tmp_path):
    results = tmp_path / "results"
    key_dir = results / "demo-mini"
    tag = uuid.uuid4().hex
    proc = _start_sweep(repo_root, results, tag)
    try:
        _wait_for_replay(key_dir / FIRST, proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        left = wait_until_gone(tag, 2.0)
    finally:
        _cleanup(proc, tag)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert not left, f"left running after the sweep stopped: {left}\n{out}"
    assert (key_dir / FIRST / "status.txt").read_text() == "FAILED\ninterrupted by SIGTERM\n"
    assert sorted(p.name for p in key_dir.iterdir()) == ["aggregated", FIRST]  # no later cell ran
    assert f"sweep: SIGTERM: stopping {FIRST}" in out
    assert f"sweep: [1/3] {FIRST} interrupted (SIGTERM)" in out
    assert "sweep: interrupted by SIGTERM; 3 cell(s) left: rerun the same command with --resume" in out
    assert (key_dir / "aggregated" / "summary.csv").exists()  # what there is still gets collected


def test_sigkill_to_the_sweep_still_stops_the_cell_with_its_verdict(repo_root, tmp_path):
    results = tmp_path / "results"
    rd = results / "demo-mini" / FIRST
    tag = uuid.uuid4().hex
    proc = _start_sweep(repo_root, results, tag)
    try:
        _wait_for_replay(rd, proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        # The launcher gets SIGTERM when the sweep dies; the cell stops its children and writes its verdict.
        left = wait_until_gone(tag, 20.0)
    finally:
        _cleanup(proc, tag)
    assert not left, f"left running after the sweep was killed: {left}"
    assert (rd / "status.txt").read_text() == "FAILED\ninterrupted by SIGTERM\n"
