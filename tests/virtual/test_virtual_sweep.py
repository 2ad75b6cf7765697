"""A sweep's virtual-clock cells run in the sweep's own process when its launcher is this machine's:
the same result directories and verdicts, a stop signal ends the running cell with its verdict
written, and ``--resume`` finishes the rest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agentsweep.config.matrix import select_cells
from agentsweep.contract.resultdir import read_status
from agentsweep.sweep.local import CellRun, run_in_process, runs_in_process

from tests.support import wait_for_file

pytestmark = pytest.mark.slow

FIRST = "demo-mini-tp1-ep1-u2-on"


def test_only_virtual_cells_on_the_local_launcher_run_in_the_sweeps_process(repo_root: Path) -> None:
    (wall,) = select_cells(None, ["demo-mini"], offload=["on"])
    virtual = wall.replace(clock="virtual")
    local = repo_root / "runners" / "launch_local.sh"
    assert runs_in_process(CellRun(virtual, Path("r")), local, environ={})
    assert not runs_in_process(CellRun(wall, Path("r")), local, environ={})
    assert not runs_in_process(
        CellRun(virtual, Path("r")), repo_root / "runners" / "launch_h200.sh", environ={}
    )
    # A cell script of its own (AGENTSWEEP_CELL_SCRIPT) is the launcher's to start.
    assert not runs_in_process(CellRun(virtual, Path("r")), local, environ={"AGENTSWEEP_CELL_SCRIPT": "x.sh"})


def _sweep(repo_root: Path, results: Path, *extra: str, env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "agentsweep.cli", "sweep", "--key", "demo-mini", "--clock", "virtual"]
    return subprocess.Popen(
        [*cmd, "--results", str(results), "--no-plots", *extra],
        cwd=repo_root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_sigterm_ends_the_running_cell_with_its_verdict_and_resume_finishes(
    repo_root: Path, tmp_path: Path, process_tree
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSWEEP_CELL", "RESULT_DIR", "PORT")}
    env |= process_tree.env
    env.pop("AGENTSWEEP_CELL_SCRIPT", None)
    results = tmp_path / "results"
    key_dir = results / "demo-mini"
    proc = _sweep(repo_root, results, "--duration", "3600", env=env)
    try:  # the marked processes are killed at teardown should the test fail first
        wait_for_file(key_dir / FIRST / "requests.jsonl", timeout=60, nonempty=True, process=proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        process_tree.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert f"sweep: cell -> {(key_dir / FIRST).resolve()} (in this process: virtual clock)" in out
    assert "launch_local:" not in out  # no launcher process was started
    assert (key_dir / FIRST / "status.txt").read_text() == "FAILED\ninterrupted by SIGTERM\n"
    assert f"sweep: [1/3] {FIRST} interrupted (SIGTERM)" in out
    assert "sweep: interrupted by SIGTERM; 3 cell(s) left: rerun the same command with --resume" in out
    assert sorted(p.name for p in key_dir.iterdir()) == ["aggregated", FIRST]  # no later cell ran
    # The same command with --resume (a shorter replay) runs the interrupted cell again and the rest.
    proc = _sweep(repo_root, results, "--duration", "10", "--resume", env=env)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "sweep: finished in" in out and "3 SUCCESS" in out
    for cell in select_cells(None, ["demo-mini"]):
        found = read_status(key_dir / cell.exp_name)
        assert found is not None and found.verdict == "SUCCESS", cell.exp_name
        assert (key_dir / cell.exp_name / "receipt.json").exists()
    assert (key_dir / "aggregated" / "summary.csv").exists()


def test_a_cell_refused_in_the_sweeps_process_is_recorded_as_agentsweep_cell_records_it(
    repo_root: Path, tmp_path: Path
) -> None:
    """A cell its plan refuses (a simulated cell that names no GPU, written by hand) is refused before
    any engine starts: its FAILED verdict, cell.json and receipt are written, the run says why, and
    the sweep goes on to the next cell."""
    (cell,) = select_cells(None, ["demo-mini"], offload=["on"])
    bare = cell.replace(clock="virtual", runner="mybox", hardware="")
    run = CellRun(bare, tmp_path / "r")
    run_in_process(run, repo_root)
    assert run.state == "FAILED" and run.reason is not None and "names the GPU it simulates" in run.reason
    found = read_status(tmp_path / "r")
    assert found is not None and found.verdict == "FAILED" and found.reason == run.reason
    assert (tmp_path / "r" / "cell.json").exists() and (tmp_path / "r" / "receipt.json").exists()
