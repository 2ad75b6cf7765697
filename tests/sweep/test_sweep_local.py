"""The local sweep through a real (stand-in) launcher: order, refusal, --resume, --force, dry run, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agentsweep.cli import main

from tests.support import poll_until

CONFIG = textwrap.dedent(
    """
    mini:
      runner: local
      engine: sim
      model: m
      precision: fp8
      duration: 5
      speed: 10
      traces: kv-cache-tester/sample_traces
      search_space:
        tp1: {users: [1, 2], offload: [on, off]}
    """
)

# A launcher with the real contract (the cell as JSON in AGENTSWEEP_CELL, RESULT_DIR, exit status of the cell) that runs no
# engine: it logs the cell, fails the cells named in FAIL_CELLS, and sleeps SLEEP_S (killable by SIGTERM).
LAUNCHER = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    set -u
    read -r EXP_NAME OFFLOAD USERS < <(python3 -c 'import json, os
    c = json.loads(os.environ["AGENTSWEEP_CELL"])
    print(c["exp_name"], c["offload"], c["users"])')
    echo "$EXP_NAME $OFFLOAD $USERS $RESULT_DIR" >> "$LAUNCH_LOG"
    mkdir -p "$RESULT_DIR"
    sleep "${SLEEP_S:-0}" &
    trap 'kill $! 2>/dev/null; printf "FAILED\\ninterrupted by SIGTERM\\n" > "$RESULT_DIR/status.txt"; exit 1' TERM
    trap 'kill $! 2>/dev/null; printf "FAILED\\ninterrupted by SIGINT\\n" > "$RESULT_DIR/status.txt"; exit 1' INT
    : > "$RESULT_DIR/.traps-set"
    wait $!
    case " ${FAIL_CELLS:-} " in
      *" $EXP_NAME "*) printf 'FAILED\\nengine exited with status 1\\n' > "$RESULT_DIR/status.txt"; exit 1 ;;
    esac
    case " ${INVALID_CELLS:-} " in
      *" $EXP_NAME "*) printf 'INVALID\\nfailed_share: 9 of 10 requests failed\\n' > "$RESULT_DIR/status.txt"; exit 1 ;;
    esac
    echo SUCCESS > "$RESULT_DIR/status.txt"
    """
)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    config = tmp_path / "sweep.yaml"
    config.write_text(CONFIG)
    launcher = tmp_path / "launch_stub.sh"
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    log = tmp_path / "launch.log"
    monkeypatch.setenv("LAUNCH_LOG", str(log))
    monkeypatch.delenv("FAIL_CELLS", raising=False)
    monkeypatch.delenv("INVALID_CELLS", raising=False)
    monkeypatch.delenv("SLEEP_S", raising=False)
    base = ["sweep", "--key", "mini", "--config", str(config), "--results", str(tmp_path / "results")]
    base += ["--launcher", str(launcher), "--no-collect"]
    return base, log, tmp_path / "results" / "mini"


def _launched(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return [line.split()[0] for line in lines]


ALL = ["mini-tp1-ep1-u1-on", "mini-tp1-ep1-u1-off", "mini-tp1-ep1-u2-on", "mini-tp1-ep1-u2-off"]


@pytest.mark.integration
def test_runs_every_cell_in_order_then_resume_reruns_only_unfinished(setup, monkeypatch, capsys):
    base, log, key_dir = setup
    monkeypatch.setenv("FAIL_CELLS", "mini-tp1-ep1-u1-off mini-tp1-ep1-u2-on")
    assert main(base) == 1
    assert _launched(log) == ALL
    out = capsys.readouterr().out
    assert "sweep: [2/4] mini-tp1-ep1-u1-off FAILED: engine exited with status 1" in out
    assert "sweep: finished in" in out and "2 FAILED, 2 SUCCESS" in out

    # Reusing the results directory without --resume is refused, and nothing runs.
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "already holds results (2 of 4 selected cells SUCCESS); use --resume" in err
    assert _launched(log) == []

    monkeypatch.setenv("FAIL_CELLS", "")
    (key_dir / "mini-tp1-ep1-u2-on" / "leftover.txt").write_text("from the failed run")
    assert main([*base, "--resume"]) == 0
    assert _launched(log) == ["mini-tp1-ep1-u1-off", "mini-tp1-ep1-u2-on"]
    assert not (key_dir / "mini-tp1-ep1-u2-on" / "leftover.txt").exists()  # a rerun starts clean
    assert "4 cells, 2 to run, 2 already SUCCESS (skipped)" in capsys.readouterr().out

    assert main([*base, "--resume"]) == 0
    assert _launched(log) == []
    assert main([*base, "--force"]) == 0
    assert _launched(log) == ALL


@pytest.mark.integration
def test_filters_and_only(setup):
    base, log, _ = setup
    assert main([*base, "--offload", "off", "--only", "*-u2-*"]) == 0
    assert _launched(log) == ["mini-tp1-ep1-u2-off"]


def test_bad_options_are_one_line_errors(setup, capsys):
    base, _, _ = setup
    assert main([*base, "--resume", "--force"]) == 2
    assert "--resume and --force contradict each other" in capsys.readouterr().err
    assert main([*base, "--only", "nothing-*"]) == 2
    assert "--only nothing-*: matches no cell" in capsys.readouterr().err
    assert main([*base, "--users", "x"]) == 2
    assert "--users x: 'x' is not a positive integer" in capsys.readouterr().err


def test_dry_run_prints_exact_commands_and_touches_nothing(setup, capsys, tmp_path):
    base, log, key_dir = setup
    assert main([*base, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert not key_dir.exists() and not log.exists()
    assert out.count("[BEGIN CELL") == 4 and "[END CELL 4/4]" in out
    assert f"RESULT_DIR={key_dir}/mini-tp1-ep1-u1-on {tmp_path}/launch_stub.sh" in out
    assert (
        f"engine:  {sys.executable} -m agentsweep.cli engine-sim m --host 127.0.0.1 --port '$PORT' "
        "--tensor-parallel-size 1 --hardware h200 --speed 10 --quantization fp8 --kv-offloading-size 256"
    ) in out
    assert f"--output-dir {key_dir}/mini-tp1-ep1-u2-off --max-users 2 --test-duration 5" in out
    assert "collect:" not in out  # --no-collect: the dry run shows what would run, and collect would not
    collecting = [a for a in base if a != "--no-collect"]
    collect = (
        f"collect: {sys.executable} -m agentsweep.cli collect {key_dir} {key_dir.parent}/.mini.aggregated.new"
    )
    assert main([*collecting, "--dry-run"]) == 0
    assert f"{collect}\n" in capsys.readouterr().out
    assert main([*collecting, "--dry-run", "--no-plots"]) == 0
    assert f"{collect} --no-plots\n" in capsys.readouterr().out
    assert not key_dir.exists() and not log.exists()


@pytest.mark.integration
def test_ctrl_c_stops_the_current_cell_cleanly_and_still_collects(setup, tmp_path):
    base, log, key_dir = setup
    base = [a for a in base if a != "--no-collect"]
    env = {**os.environ, "SLEEP_S": "30"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", *base],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        poll_until((key_dir / "mini-tp1-ep1-u1-on" / ".traps-set").exists, timeout=20)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert _launched(log) == ["mini-tp1-ep1-u1-on"]  # nothing after the interrupted cell
    # The cell gets the signal the sweep got, and its verdict says so.
    assert (key_dir / "mini-tp1-ep1-u1-on" / "status.txt").read_text() == "FAILED\ninterrupted by SIGINT\n"
    assert "sweep: SIGINT: stopping mini-tp1-ep1-u1-on (SIGINT, up to" in out
    assert "sweep: interrupted by SIGINT; 4 cell(s) left: rerun the same command with --resume" in out
    assert f"agentsweep.cli collect {key_dir} {key_dir.parent}/.mini.aggregated.new" in out
    assert (key_dir / "aggregated" / "summary.csv").exists()  # what finished (here: nothing) is collected
    assert not (key_dir.parent / ".mini.aggregated.new").exists()  # moved into place


@pytest.mark.integration
def test_invalid_cells_are_named_and_exit_3_failed_ones_win_with_1(setup, monkeypatch, capsys):
    base, _log, _key_dir = setup
    monkeypatch.setenv("INVALID_CELLS", "mini-tp1-ep1-u2-off")
    assert main(base) == 3  # every cell ran; one did not pass its checks
    out = capsys.readouterr().out
    assert "sweep: [4/4] mini-tp1-ep1-u2-off INVALID: failed_share: 9 of 10 requests failed" in out
    assert "1 INVALID, 3 SUCCESS" in out
    monkeypatch.setenv("FAIL_CELLS", "mini-tp1-ep1-u1-on")
    assert main([*base, "--force"]) == 1


@pytest.mark.integration
def test_a_second_sweep_into_the_same_results_is_refused_naming_the_holder(setup, tmp_path):
    """Even with --force: the running sweep's cell is neither deleted nor joined by another engine."""
    base, log, key_dir = setup
    env = {**os.environ, "SLEEP_S": "30"}
    first = subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", *base],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        poll_until((key_dir / "mini-tp1-ep1-u1-on" / ".traps-set").exists, timeout=20)
        second = subprocess.run(
            [sys.executable, "-m", "agentsweep.cli", *base, "--force"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 2, second.stdout + second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert line.startswith(
            f"input error: --results {tmp_path / 'results'}: another sweep is running into it"
        )
        assert f"(pid {first.pid} on " in line and "sweep --key mini" in line
        assert _launched(log) == ["mini-tp1-ep1-u1-on"]  # the second one launched nothing
        assert (key_dir / "mini-tp1-ep1-u1-on").is_dir()  # nor deleted the running cell
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    # The lock went with the first sweep: a third one runs.
    assert main([*base, "--force"]) == 0


@pytest.mark.integration
def test_a_forced_rerun_keeps_the_previous_report_until_the_new_one_replaces_it(setup):
    base, _log, key_dir = setup
    base = [*(a for a in base if a != "--no-collect"), "--no-plots"]  # the report, not its figures
    assert main(base) in (1, 3)  # the stand-in cells leave no figures: collect lists them MALFORMED
    report = key_dir / "aggregated" / "report.html"
    old = report.stat().st_ino
    env = {**os.environ, "SLEEP_S": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", *base, "--force"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # While the rerun's cells run, someone reading the report still finds it, whole.
        poll_until((key_dir / "mini-tp1-ep1-u1-on" / ".traps-set").exists, timeout=20)
        assert report.stat().st_ino == old and report.read_text().rstrip().endswith("</html>")
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (1, 3), out
    assert report.stat().st_ino != old  # the new report, put in place whole
    assert not (key_dir.parent / ".mini.aggregated.new").exists()


def test_a_folder_is_replaced_whole_and_the_old_one_removed(tmp_path, monkeypatch):
    from agentsweep.collect import output

    for exchange in (True, False):
        target, new = tmp_path / "aggregated", tmp_path / ".new"
        target.mkdir()
        (target / "report.html").write_text("old")
        (target / "stale.png").write_text("from an earlier collect")
        new.mkdir()
        (new / "report.html").write_text("new")
        if not exchange:  # a system without renameat2's exchange: moved aside, then replaced
            monkeypatch.setattr(output, "_exchange", lambda a, b: False)
        output.replace_folder(new, target)
        assert sorted(p.name for p in target.iterdir()) == ["report.html"]
        assert (target / "report.html").read_text() == "new"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["aggregated"]
        import shutil

        shutil.rmtree(target)
