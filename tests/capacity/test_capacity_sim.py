"""A capacity cell on the simulated engine, end to end: one engine start, steps/<n>/ each a complete
result directory, a cold prefix cache at every step, capacity.json and the tier lines; and its faults
(a failing engine, SIGTERM, an engine that dies, a spent budget). Short runs: a few steps of seconds."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agentsweep.contract.cell import CELL_ENV_VAR
from agentsweep.contract.resultdir import read_capacity, read_cell_record, result_file

from tests.support import wait_until

pytestmark = pytest.mark.slow

STEP_FILES = ("cell.json", "status.txt", "requests.jsonl", "summary.json", "server_metrics.csv", "server.log",
              "replay.log")  # fmt: skip


def capacity_cell(
    repo_root: Path, tiers: dict[str, list[Any]], low: int, high: int, **over: Any
) -> dict[str, Any]:
    cell: dict[str, Any] = {
        "config_key": "cap",
        "exp_name": f"cap-tp1-ep1-u{low}to{high}-off",
        "runner": "local",
        "engine": "sim",
        "hardware": "h200",
        "model": "meta-llama/Llama-3.3-70B-Instruct",
        "precision": "fp8",
        "tp": 1,
        "users": high,
        "offload": "off",
        "duration": 5,
        "speed": 50,
        "traces": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "max_context": 65536,
        "advance_max": 0.5,
        "engine_args": "--num-gpu-blocks-override 16000",
        # What these tests check is the search, not each run's steadiness on a busy machine.
        "max_dispatch_lag_p99_s": 2.0,
        "max_throughput_drift": 5.0,
        "min_window_coverage": 0.5,  # one user on a busy machine: a second may pass without a token
        "capacity": {
            "low": low,
            "high": high,
            "time_limit_min": 30,
            "tiers": [{"name": n, "constraints": c} for n, c in tiers.items()],
        },
    }
    return {**cell, **over}


def start(repo_root: Path, rd: Path, cell: dict[str, Any], **env: str) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "RESULT_DIR", "PORT")}
    return subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", "cell", "--health-timeout", "60"],
        env={**base, CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(rd), **env},
        cwd=repo_root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run(repo_root: Path, rd: Path, cell: dict[str, Any], timeout: float = 300, **env: str) -> tuple[int, str]:
    proc = start(repo_root, rd, cell, **env)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def constraint(text: str) -> dict[str, Any]:
    metric, stat, op, value, unit = text.split()
    return {"metric": metric, "stat": stat, "op": op, "value": float(value), "unit": unit}


def test_a_capacity_cell_runs_its_steps_in_one_engine_start(repo_root: Path, tmp_path: Path) -> None:
    rd = tmp_path / "cap"
    tiers = {"roomy": [constraint("ttft p90 <= 1000 s")], "impossible": [constraint("ttft p90 <= 0.001 s")]}
    code, out = run(repo_root, rd, capacity_cell(repo_root, tiers, 1, 4))
    assert code == 0, out
    assert out.count("starting engine:") == 1
    assert "tier roomy (TTFT p90 ≤ 1,000 s): ≥ 4 agents per GPU" in out
    assert "tier impossible (TTFT p90 ≤ 0.001 s): 0 agents per GPU: even 1 users miss it (TTFT p90 " in out
    assert (rd / "status.txt").read_text() == "SUCCESS\n"
    record = read_capacity(rd)
    assert record is not None and record.stop_reason == "converged"
    assert [s.users for s in record.steps] == [1, 2, 4]
    assert record.engine_s > 0 and record.step_budget > 3
    resets = (rd / "server.log").read_text().count("prefix cache reset")
    assert resets == len(record.steps)
    for step in record.steps:
        sdir = rd / step.dir
        for name in STEP_FILES:
            assert (sdir / name).stat().st_size > 0, (step.dir, name)
        for path in sdir.iterdir():
            result_file(path.name)
        cell_record = read_cell_record(sdir)
        assert cell_record is not None and cell_record.parse_cell().users == step.users
        assert cell_record.status == step.status == "SUCCESS"
        assert "GPU KV cache size: 256,000 tokens" in (sdir / "server.log").read_text()
        # A cold cache at every step: each lane's first request (a warm-up) hits nothing, although the
        # same lanes replayed the same traces in the step before.
        warmups = [json.loads(line) for line in (sdir / "requests.jsonl").read_text().splitlines()]
        warmups = [r for r in warmups if r.get("phase") == "warmup"]
        assert warmups and all(r["cached_tokens"] == 0 for r in warmups), step.dir
        # On the wall clock every step measures its client, and the client was not the limit.
        checks = json.loads((sdir / "summary.json").read_text())["validity"]["checks"]
        for check in ("client_cpu_share", "dispatch_lag_p99"):
            assert checks[check]["ok"] is True and checks[check]["value"] is not None, (
                step.dir,
                checks[check],
            )
    for path in rd.iterdir():
        result_file(path.name)

    out_dir = tmp_path / "agg"
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "collect", str(rd), str(out_dir)],
        capture_output=True, text=True, timeout=120, cwd=repo_root,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "collect: 1 cells (and 3 capacity steps), 1 SUCCESS" in proc.stderr
    with open(out_dir / "capacity.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["source"], r["tier"], r["boundary_type"]) for r in rows] == [
        ("search", "roomy", "at_least"),
        ("search", "impossible", "none"),
    ]
    with open(out_dir / "summary.csv", newline="") as fh:
        summary = list(csv.DictReader(fh))
    assert [r["step_of"] for r in summary] == ["", *[record.exp_name] * 3]
    assert (out_dir / f"capacity_{record.exp_name}.png").stat().st_size > 10_000
    report = (out_dir / "report.html").read_text()
    assert (
        "Capacity under SLO" in report and '<td class="big">≥ 4</td>' in report
    )  # the headline's roomy tier


def test_a_failing_engine_never_meets_a_tier(repo_root: Path, tmp_path: Path) -> None:
    rd = tmp_path / "cap"
    tiers = {"roomy": [constraint("ttft p90 <= 1000 s")]}
    cell = capacity_cell(
        repo_root, tiers, 1, 4, engine_args="--num-gpu-blocks-override 16000 --fail-rate 0.3"
    )
    code, out = run(repo_root, rd, cell)
    assert code == 0, out
    record = read_capacity(rd)
    assert record is not None
    assert {s.status for s in record.steps} == {"INVALID"}
    tier = record.tiers[0]
    assert (tier.boundary_users, tier.boundary_type, tier.binding) == (0, "none", "validity")
    assert "failed_share" in tier.line and tier.stop_reason == "lowest count fails"


def test_sigterm_keeps_the_finished_steps_and_says_interrupted(
    repo_root: Path, tmp_path: Path, process_tree
) -> None:
    rd = tmp_path / "cap"
    cell = capacity_cell(repo_root, {"roomy": [constraint("ttft p90 <= 1000 s")]}, 1, 16, duration=20)
    proc = start(repo_root, rd, cell, **process_tree.env)
    try:
        wait_until(
            lambda: (found := read_capacity(rd)) is not None and len(found.steps) >= 1,
            timeout=120,
            what="the first finished step",
            process=proc,
        )
        # Then SIGTERM in the middle of the second step's replay.
        wait_until(lambda: (rd / "steps" / "1" / "requests.jsonl").exists(), timeout=60, what="step 1's replay",
                   process=proc)  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    status = (rd / "status.txt").read_text().splitlines()
    assert status == ["FAILED", "interrupted by SIGTERM"]
    record = read_capacity(rd)
    assert record is not None and record.stop_reason == "interrupted"
    assert [(s.users, s.status) for s in record.steps] == [(1, "SUCCESS"), (2, "FAILED")]
    for name in STEP_FILES:
        assert (rd / "steps" / "0" / name).stat().st_size > 0, name
    interrupted = rd / "steps" / "1"
    assert (interrupted / "status.txt").read_text().splitlines() == ["FAILED", "interrupted by SIGTERM"]
    assert (interrupted / "requests.jsonl").exists() and (interrupted / "summary.json").exists()
    assert record.tiers[0].stop_reason == "interrupted"
    assert process_tree.wait_until_gone(30.0) == {}


def test_an_engine_that_dies_fails_the_cell_and_keeps_the_steps_so_far(
    repo_root: Path, tmp_path: Path
) -> None:
    rd = tmp_path / "cap"
    tiers = {"roomy": [constraint("ttft p90 <= 1000 s")]}
    cell = capacity_cell(
        repo_root, tiers, 1, 16, engine_args="--num-gpu-blocks-override 16000 --crash-after 40"
    )
    code, out = run(repo_root, rd, cell)
    assert code == 1, out
    status = (rd / "status.txt").read_text().splitlines()
    assert status[0] == "FAILED" and "engine exited with status 1" in status[1]
    record = read_capacity(rd)
    assert record is not None and record.stop_reason == "engine failed"
    assert record.steps[0].status == "SUCCESS" and record.steps[-1].status == "FAILED"
    assert record.tiers[0].stop_reason == "engine failed" and record.tiers[0].boundary_type == "unresolved"


def test_a_spent_budget_stops_the_search_with_that_reason(repo_root: Path, tmp_path: Path) -> None:
    rd = tmp_path / "cap"
    cell = capacity_cell(repo_root, {"roomy": [constraint("ttft p90 <= 1000 s")]}, 1, 16, duration=10)
    cell["capacity"]["time_limit_min"] = 1
    # 60 s of job, none for start-up, 32 s to drain: 28 s of steps, each reckoned at 10 + 10 s. The live
    # check counts from the cell's start: the first step fits while the engine took under 8 s to start,
    # and the second never does, whatever the machine, as the first one's replay alone takes 10 s.
    code, out = run(repo_root, rd, cell, AGENTSWEEP_STARTUP_MARGIN_S="0", AGENTSWEEP_DRAIN_MARGIN_S="32")
    assert code == 0, out
    assert "step budget 1 steps of about 20 s within the job's 1 min time limit" in out
    record = read_capacity(rd)
    assert record is not None and record.stop_reason == "budget spent"
    assert len(record.steps) == 1 and record.step_budget == 1
    assert record.tiers[0].line.endswith("not bracketed (budget spent)")


def test_the_demo_ends_a_tier_at_its_kv_cliff(repo_root: Path, tmp_path: Path) -> None:
    """demo-capacity around its cliff (4..6 users: three steps): the interactive tier ends at the KV
    cliff between 5 and 6 users, where the sessions' live context outgrows the 256k-token pool.

    On the virtual clock (docs/virtual-clock.md): the boundary is the wall clock's (the search's own
    figures, scripts/bench_virtual.py), but a machine busy with other tests cannot move it, and the
    three steps take seconds instead of minutes."""
    results = tmp_path / "results"
    base = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "RESULT_DIR", "PORT")}
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "sweep", "--config", str(repo_root / "configs" / "agentic.yaml"),
         "--key", "demo-capacity", "--search", "4:6", "--clock", "virtual", "--results", str(results),
         "--no-collect"],
        capture_output=True, text=True, timeout=600, cwd=repo_root, env=base,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rd = results / "demo-capacity" / "demo-capacity-tp1-ep1-u4to6-off"
    record = read_capacity(rd)
    assert record is not None and record.stop_reason == "converged"
    assert [(s.users, s.status) for s in record.steps] == [(4, "SUCCESS"), (6, "SUCCESS"), (5, "SUCCESS")]
    tiers = {t.tier: t for t in record.tiers}
    interactive = tiers["interactive"]
    assert (interactive.boundary_users, interactive.boundary_type) == (5, "cliff")
    assert interactive.binding == "TTFT p90"
    cliff = interactive.cliff
    assert cliff is not None and (cliff.below_users, cliff.above_users) == (5, 6)
    assert cliff.factor is not None and cliff.factor > record.cliff_factor
    assert cliff.kv_pool_above == 256_000
    assert cliff.kv_working_set_above is not None and cliff.kv_working_set_above > cliff.kv_pool_above
    assert "a cliff: TTFT p90" in interactive.line and interactive.line in proc.stdout
    # The fast tier misses already at 4 users: capacity 0 below this range, not a cliff.
    assert tiers["fast"].boundary_type == "none"
    # The client's own limits are not judged on the virtual clock (its work takes no simulated time):
    # no figure, where the wall clock's steps measure one, and summary.json says why.
    largest = max(record.steps, key=lambda s: s.users)
    validity = json.loads((rd / largest.dir / "summary.json").read_text())["validity"]["checks"]
    for check in ("client_cpu_share", "dispatch_lag_p99"):
        assert validity[check]["ok"] is True and validity[check]["value"] is None, validity[check]
        assert validity[check]["note"].startswith("not judged: on the virtual clock"), validity[check]


def test_a_replayer_killed_mid_step_stops_the_search_as_failed(
    repo_root: Path, tmp_path: Path, process_tree
) -> None:
    """The step measured nothing: the search stops with "step failed" and the cell is FAILED, never
    "converged" with a capacity bound by that step's "validity"."""
    rd = tmp_path / "cap"
    cell = capacity_cell(repo_root, {"roomy": [constraint("ttft p90 <= 1000 s")]}, 1, 8, duration=8)
    proc = start(repo_root, rd, cell, **process_tree.env)
    try:
        wait_until(lambda: (rd / "steps" / "1" / "requests.jsonl").exists(), timeout=120, what="step 1's replay",
                   process=proc)  # fmt: skip
        replayers = [pid for pid, cmd in process_tree.marked().items() if "kv_cache_tester.cli replay" in cmd]
        assert len(replayers) == 1, process_tree.marked()
        os.kill(replayers[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    status = (rd / "status.txt").read_text().splitlines()
    assert status[0] == "FAILED" and status[1].startswith(
        "step 1 (2 users) FAILED: replayer exited with status -9"
    )
    record = read_capacity(rd)
    assert record is not None and record.stop_reason == "step failed"
    assert [(s.users, s.status) for s in record.steps] == [(1, "SUCCESS"), (2, "FAILED")]
    (tier,) = record.tiers
    assert (tier.boundary_users, tier.boundary_type, tier.stop_reason, tier.binding) == (
        1, "unresolved", "step failed", None,
    )  # fmt: skip
    assert "capacity search stopped: step failed after 2 step(s)" in out
    assert process_tree.wait_until_gone(30.0) == {}


def test_a_time_limit_that_holds_no_step_fails_before_the_engine_starts(
    repo_root: Path, tmp_path: Path
) -> None:
    rd = tmp_path / "cap"
    cell = capacity_cell(repo_root, {"roomy": [constraint("ttft p90 <= 1000 s")]}, 1, 16)
    cell["capacity"]["time_limit_min"] = 1  # 60 s: less than the start-up and drain margins alone
    code, out = run(repo_root, rd, cell)
    assert code == 1, out
    assert "starting engine" not in out
    status = (rd / "status.txt").read_text().splitlines()
    assert status[0] == "FAILED" and status[1].startswith("the job's time limit holds no step: step budget 0")
    record = read_capacity(rd)
    assert record is not None and (record.stop_reason, record.steps, record.step_budget) == (
        "budget spent",
        (),
        0,
    )
    assert (rd / "receipt.json").exists()


def test_a_budget_spent_before_the_first_step_is_not_success(repo_root: Path, tmp_path: Path) -> None:
    rd = tmp_path / "cap"
    cell = capacity_cell(repo_root, {"roomy": [constraint("ttft p90 <= 1000 s")]}, 1, 16)
    cell["capacity"]["time_limit_min"] = 1
    # 60 s of job, none for start-up, 45 s to drain: 15 s of steps, each reckoned at 5 + 10 s. One step
    # on paper; none once the engine's start took its first second.
    code, out = run(repo_root, rd, cell, AGENTSWEEP_STARTUP_MARGIN_S="0", AGENTSWEEP_DRAIN_MARGIN_S="45")
    assert code == 1, out
    assert "step budget 1 steps of about 15 s" in out and "starting engine" in out
    status = (rd / "status.txt").read_text().splitlines()
    assert status == ["FAILED", "budget spent before the first step: no step fits the time left"]
    record = read_capacity(rd)
    assert record is not None and record.stop_reason == "budget spent" and record.steps == ()


SWEEP_KEY = """\
cap:
  runner: local
  engine: sim
  model: meta-llama/Llama-3.3-70B-Instruct
  precision: fp8
  image: ""
  duration: {duration}
  speed: 50
  traces: {traces}
  engine_args: [--num-gpu-blocks-override, "16000"]
  replay: {{max_context: 65536, advance_max: 0.5}}
  validity: {{max_dispatch_lag_p99_s: 2.0, max_throughput_drift: 5.0}}
  slo:
    roomy: ["ttft p90 <= 1000 s"]
  search_space:
    tp1: {{users: {{search: [1, {high}]}}, offload: [off]}}
"""


def sweep_config(repo_root: Path, tmp_path: Path, high: int, duration: int = 4) -> Path:
    path = tmp_path / "cap.yaml"
    traces = repo_root / "kv-cache-tester" / "sample_traces"
    path.write_text(SWEEP_KEY.format(duration=duration, traces=traces, high=high))
    return path


def sweep(repo_root: Path, config: Path, results: Path, *extra: str, env: dict[str, str] | None = None):
    base = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "RESULT_DIR", "PORT")}
    return subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", "sweep", "--config", str(config), "--key", "cap",
         "--results", str(results), *extra],
        cwd=repo_root, env={**base, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_a_capacity_sweep_passes_verify_ingest_and_export(repo_root: Path, tmp_path: Path) -> None:
    """Its steps are result directories with receipts: verify matches all, the store takes the cell and
    its steps, export writes the steps (the capacity cell is no row). On the virtual clock: the steps'
    result directories are the wall clock's, files and receipts alike."""
    results = tmp_path / "results"
    proc = sweep(
        repo_root, sweep_config(repo_root, tmp_path, high=2), results, "--clock", "virtual", "--no-collect"
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    key = results / "cap"
    rd = key / "cap-tp1-ep1-u1to2-off"
    record = read_capacity(rd)
    assert record is not None and len(record.steps) == 2
    assert all((rd / s.dir / "receipt.json").is_file() for s in record.steps)

    def agentsweep(*argv: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "agentsweep.cli", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=repo_root)

    verified = agentsweep("verify", str(key))
    assert verified.returncode == 0 and "3 result directories match their receipts" in verified.stderr
    ingested = agentsweep("results", "ingest", "--db", f"sqlite:///{tmp_path / 'store.db'}", str(key))
    assert ingested.returncode == 0 and "3 points added" in ingested.stderr, ingested.stderr
    exported = agentsweep("export", str(key), "-o", str(tmp_path / "rows"))
    assert exported.returncode == 0, exported.stderr
    rows = json.loads((tmp_path / "rows" / "results_bmk" / "agg_bmk.json").read_text())
    assert sorted((r["exp_name"], r["conc"]) for r in rows) == [(s.exp_name, s.users) for s in record.steps]
    assert all(r["p90_ttft"] is not None for r in rows)


def test_resume_keeps_the_measured_steps_and_measures_only_the_missing_ones(
    repo_root: Path, tmp_path: Path, process_tree
) -> None:
    results = tmp_path / "results"
    config = sweep_config(repo_root, tmp_path, high=4)
    rd = results / "cap" / "cap-tp1-ep1-u1to4-off"
    proc = sweep(repo_root, config, results, "--no-collect", env=process_tree.env)
    try:
        wait_until(lambda: (rd / "steps" / "1" / "requests.jsonl").exists(), timeout=120, what="step 1's replay",
                   process=proc)  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out
    assert process_tree.wait_until_gone(30.0) == {}
    first = {p.name: p.read_bytes() for p in (rd / "steps" / "0").iterdir()}
    assert (rd / "steps" / "1" / "status.txt").read_text().splitlines()[0] == "FAILED"

    again = sweep(repo_root, config, results, "--resume", "--no-collect")
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out
    assert "--resume keeps 1 measured step(s) (users 1)" in out
    assert "resuming: 1 measured step(s) stand (users 1); not measured again" in out
    assert "step 0: 1 users\n" not in out and "step 1: 2 users" in out
    assert {p.name: p.read_bytes() for p in (rd / "steps" / "0").iterdir()} == first  # not measured again
    record = read_capacity(rd)
    assert record is not None and record.stop_reason != "interrupted"
    assert [s.users for s in record.steps][:2] == [1, 2] and all(s.status != "FAILED" for s in record.steps)
    assert (rd / "status.txt").read_text() == "SUCCESS\n"
    verified = subprocess.run([sys.executable, "-m", "agentsweep.cli", "verify", str(rd.parent)],
                              capture_output=True, text=True, timeout=120, cwd=repo_root)  # fmt: skip
    assert verified.returncode == 0, verified.stderr
