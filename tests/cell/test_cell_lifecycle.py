"""The cell lifecycle with real stand-in processes: the verdict is written on every exit path."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from agentsweep.cell.engines import EngineLaunch
from agentsweep.cell.lifecycle import run_cell
from agentsweep.cell.placement import free_port
from agentsweep.cell.plan import CellOptions, CellPlan, plan_cell
from agentsweep.cell.port_allocation import FreePortAllocator
from agentsweep.contract.cell import Cell
from agentsweep.contract.receipt import read_receipt, verify

from tests.support import pid_running, wait_for_file

pytestmark = pytest.mark.integration

CELL = Cell(
    exp_name="t-tp1-ep1-u2-off",
    engine="sim",
    hardware="h200",
    model="m",
    tp=1,
    users=2,
    offload="off",
    duration=5,
    traces="t",
)


def _plan(standins, result_dir: Path, *, engine_flags=(), replay_seconds=0.5, replay_exit=0) -> CellPlan:
    port = free_port()
    plan = plan_cell(CELL, result_dir, ports=FreePortAllocator(cell_port=port))
    engine = dataclasses.replace(
        plan.instances[0],
        engine=EngineLaunch(
            argv=[*standins["engine"], "--port", str(port), *engine_flags], env={"HF_TOKEN": "s"}
        ),
        scraper_argv=[*standins["scraper"], str(result_dir)],
    )
    return dataclasses.replace(
        plan,
        instances=[engine],
        replay_argv=[*standins["replayer"], str(result_dir), str(replay_seconds), str(replay_exit)],
    )


def _record(result_dir: Path) -> tuple[dict, list[str]]:
    return json.loads((result_dir / "cell.json").read_text()), (
        result_dir / "status.txt"
    ).read_text().splitlines()


FAST = CellOptions(health_timeout_s=20, engine_stop_grace_s=2, replay_stop_grace_s=5)


def test_success_writes_cell_json_and_status(standins, tmp_path):
    rd = tmp_path / "r"
    status, reason = run_cell(_plan(standins, rd), FAST, log=lambda _: None)
    assert (status, reason) == ("SUCCESS", None)
    record, lines = _record(rd)
    assert lines == ["SUCCESS"]
    assert record["schema_version"] == 1 and record["status"] == "SUCCESS" and record["reason"] is None
    assert record["cell"]["exp_name"] == CELL.exp_name
    assert record["engine_env"] == {"HF_TOKEN": "***"}
    assert record["versions"]["engine"] == "0.1.0"  # sim: the agentsweep version
    assert record["replay_command"][-3:] == [str(rd), "0.5", "0"]
    assert record["start_utc"].endswith("Z") and record["end_utc"] >= record["start_utc"]
    assert (rd / "server.log").read_text().startswith("standin engine starting")
    assert "replayed" in (rd / "replay.log").read_text()
    # One engine, no router: its files carry no instance name, and no merged scrape is written.
    assert (rd / "server_metrics.csv").stat().st_size > 0 and (rd / "metrics-collector.log").exists()
    assert "scaleout" not in record and not list(rd.glob("server_metrics.*.csv"))
    _assert_sealed_last(rd, engine_version="0.1.0")


def _assert_sealed_last(rd: Path, engine_version: str | None) -> None:
    """receipt.json is there, written after every other file, and covers all of them."""
    receipt = read_receipt(rd)
    others = [p for p in rd.rglob("*") if p.is_file() and p.name != "receipt.json"]
    assert sorted(receipt.files) == sorted(p.relative_to(rd).as_posix() for p in others)
    newest = max(p.stat().st_mtime_ns for p in others)
    assert (rd / "receipt.json").stat().st_mtime_ns >= newest
    assert verify(rd) == []
    assert receipt.recipe.engine_version == engine_version and receipt.replayer_version
    assert receipt.recipe.client == "replay" and receipt.recipe.client_version == receipt.replayer_version


def test_never_healthy_engine_fails_the_cell_with_the_reason(standins, tmp_path):
    rd = tmp_path / "r"
    start = time.monotonic()
    status, _reason = run_cell(
        _plan(standins, rd, engine_flags=("--mode", "never")),
        dataclasses.replace(FAST, health_timeout_s=1.5),
        log=lambda _: None,
    )
    assert time.monotonic() - start < 8
    assert status == "FAILED"
    record, lines = _record(rd)
    assert lines[0] == "FAILED"
    assert lines[1].startswith("engine not healthy after 1.5 s (http://127.0.0.1:")
    assert record["reason"] == lines[1]
    assert not (rd / "requests.jsonl").exists()  # the replayer never started
    _assert_sealed_last(rd, engine_version=None)  # a FAILED cell is sealed too


def test_engine_dying_mid_replay_fails_the_cell(standins, tmp_path):
    rd = tmp_path / "r"
    plan = _plan(standins, rd, engine_flags=("--mode", "crash-after", "--after", "1.0"), replay_seconds=30)
    start = time.monotonic()
    status, reason = run_cell(plan, dataclasses.replace(FAST, engine_death_wait_s=1.0), log=lambda _: None)
    assert status == "FAILED"
    assert (
        reason
        == "engine exited with status 7 during the replay; last log line: engine core died: segfault (standin)"
    )
    # The stand-in replayer has no circuit breaker: the cell gives it 1 s, then SIGTERMs it.
    assert time.monotonic() - start < 15
    assert json.loads((rd / "summary.json").read_text())["counts"]["ok"] > 0  # it flushed on SIGTERM


def test_replayer_failure_is_the_reason(standins, tmp_path):
    rd = tmp_path / "r"
    status, reason = run_cell(_plan(standins, rd, replay_exit=2), FAST, log=lambda _: None)
    assert status == "FAILED"
    assert reason.startswith("replayer exited with status 2; last line of replay.log: replayed ")


def test_a_stop_whose_exception_python_dropped_still_ends_the_cell_interrupted(
    standins, tmp_path, monkeypatch
):
    """A stop signal handled where its exception cannot propagate (an at-fork callback while a child
    starts, a ``__del__``) is lost to Python; the cell's next wait raises it, and the verdict says so."""
    from agentsweep.cell.engine_process import ManagedProcess
    from agentsweep.cell.stop import install_signal_handlers

    class SignalledInDel:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGTERM)

    original = ManagedProcess.wait
    dropped: list[bool] = []

    def wait_dropping_a_stop(self, timeout_s=None):
        if not dropped:
            dropped.append(True)
            SignalledInDel()  # the handler runs in __del__: "Exception ignored", the cell runs on
        return original(self, timeout_s)

    monkeypatch.setattr(ManagedProcess, "wait", wait_dropping_a_stop)
    rd = tmp_path / "r"
    restore = install_signal_handlers()
    try:
        status, reason = run_cell(_plan(standins, rd, replay_seconds=3), FAST, log=lambda _: None)
    finally:
        restore()
    assert dropped
    assert (status, reason) == ("FAILED", "interrupted by SIGTERM")
    assert (rd / "status.txt").read_text().splitlines() == ["FAILED", "interrupted by SIGTERM"]


DRIVER = textwrap.dedent(
    """
    import dataclasses, json, sys
    from pathlib import Path
    from agentsweep.cell.engines import EngineLaunch
    from agentsweep.cell.lifecycle import run_cell
    from agentsweep.cell.stop import install_signal_handlers
    from agentsweep.cell.plan import CellOptions, plan_cell
    from agentsweep.cell.port_allocation import FreePortAllocator
    from agentsweep.contract.cell import Cell
    engine, replayer, scraper = (json.loads(a) for a in sys.argv[1:4])
    rd, port = Path(sys.argv[4]), int(sys.argv[5])
    cell = Cell(exp_name="x", engine="sim", hardware="h200", model="m", tp=1, users=1, offload="off", duration=60, traces="t")
    plan = plan_cell(cell, rd, ports=FreePortAllocator(cell_port=port))
    one = dataclasses.replace(
        plan.instances[0],
        engine=EngineLaunch(argv=engine + ["--port", str(port), "--child-pid-file", str(rd.parent / "child.pid")]),
        scraper_argv=scraper + [str(rd)],
    )
    plan = dataclasses.replace(plan, instances=[one], replay_argv=replayer + [str(rd), "60", "0"])
    install_signal_handlers()
    status, _ = run_cell(plan, CellOptions(health_timeout_s=20, engine_stop_grace_s=2))
    sys.exit(0 if status == "SUCCESS" else 1)
    """
)


def test_sigterm_mid_replay_stops_everything_and_still_writes_the_verdict(standins, tmp_path):
    rd = tmp_path / "r"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    args = [json.dumps(standins[k]) for k in ("engine", "replayer", "scraper")]
    proc = subprocess.Popen(
        [sys.executable, str(driver), *args, str(rd), str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_file(rd / "requests.jsonl", timeout=20)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    lines = (rd / "status.txt").read_text().splitlines()
    assert lines == ["FAILED", "interrupted by SIGTERM"]
    records = (rd / "requests.jsonl").read_text().splitlines()
    assert records and all(json.loads(line)["status"] == "ok" for line in records)  # every line complete
    assert json.loads((rd / "summary.json").read_text())["counts"]["ok"] == len(records)
    child = int((tmp_path / "child.pid").read_text())
    assert not pid_running(child), f"the engine's worker outlived the cell\n{out}"
    _assert_sealed_last(rd, engine_version="0.1.0")


def test_run_cell_sh_writes_a_verdict_when_the_cell_process_dies(repo_root, tmp_path):
    rd = tmp_path / "r"
    dying = tmp_path / "dying-python"
    dying.write_text("#!/bin/sh\nkill -KILL $$\n")  # as if the OOM killer took the cell process
    dying.chmod(0o755)
    env = {**os.environ, "RESULT_DIR": str(rd), "AGENTSWEEP_PYTHON": str(dying)}
    proc = subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 137
    assert (rd / "status.txt").read_text() == (
        "FAILED\nthe cell process exited with status 137 without writing its result\n"
    )
    env.pop("RESULT_DIR")
    proc = subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert (
        proc.stderr
        == "input error: environment variable RESULT_DIR is required (the directory this cell fills)\n"
    )


def test_client_picks_the_load_generator(tmp_path):
    """client=replay runs kv-cache-tester; client=aiperf the experimental AIPerf path, same result dir."""
    replay = plan_cell(CELL, tmp_path, ports=FreePortAllocator(cell_port=8000)).replay_argv
    assert replay[1:4] == ["-m", "kv_cache_tester.cli", "replay"]
    aiperf = plan_cell(CELL.replace(client="aiperf"), tmp_path, ports=FreePortAllocator(cell_port=8000))
    assert aiperf.replay_argv[1:4] == ["-m", "agentsweep.experimental.aiperf", "run-cell"]
    cell = json.loads(aiperf.replay_argv[aiperf.replay_argv.index("--cell") + 1])
    assert cell["client"] == "aiperf" and cell["users"] == 2
    assert aiperf.replay_argv[aiperf.replay_argv.index("--output-dir") + 1] == str(tmp_path)


def test_a_cell_without_a_router_is_a_plan_of_one_engine(tmp_path):
    plan = plan_cell(CELL, tmp_path, ports=FreePortAllocator(cell_port=8000))
    (one,) = plan.instances
    assert (one.role, one.label, one.name, one.port) == ("engine", "engine", "", 8000)
    assert (one.log_name, one.metrics_name, one.collector_log_name) == (
        "server.log",
        "server_metrics.csv",
        "metrics-collector.log",
    )
    assert plan.router is None and plan.router_scraper_argv == []
    assert plan.client is one and plan.engine is one.engine and plan.base_url == one.url
    assert one.url == "http://127.0.0.1:8000"
    assert one.scraper_argv[one.scraper_argv.index("--output") + 1] == str(tmp_path / "server_metrics.csv")
    assert plan.replay_argv[plan.replay_argv.index("--api-endpoint") + 1] == one.url
