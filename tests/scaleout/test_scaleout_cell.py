"""A scale-out cell end to end: simulated replicas, the real router, the real scraper and replayer."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest
from agentsweep.contract.cell import CELL_ENV_VAR
from agentsweep.metrics.dialects import COLUMNS
from agentsweep.metrics.scrapes import merge_metrics

from .conftest import MODEL


def _cell(repo_root: Path, program: str, policy: str) -> dict[str, object]:
    return {
        "config_key": "so", "exp_name": f"so-tp1-ep1-u4-off-r2-{policy}", "runner": "local", "engine": "sim", "hardware": "h200",
        "model": MODEL, "precision": "fp8", "tp": 1, "users": 4, "offload": "off", "duration": 6,
        "traces": str(repo_root / "kv-cache-tester" / "sample_traces"), "max_context": 65536, "max_delay": 1,
        "warmup_requests": 0, "speed": 50, "engine_args": "--num-gpu-blocks-override 4096",
        "replicas": 2, "router": policy, "router_program": program,
        "max_throughput_drift": 5.0,  # a 6 s window is too short for a steady state
    }  # fmt: skip


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
@pytest.mark.parametrize(("program", "policy"), [("vllm-router", "round_robin"), ("smg", "consistent_hash")])
def test_scaleout_cell_succeeds_and_sums_its_replicas(
    repo_root: Path, tmp_path: Path, program: str, policy: str
):
    rd = tmp_path / "cell"
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    env.update({CELL_ENV_VAR: json.dumps(_cell(repo_root, program, policy)), "RESULT_DIR": str(rd)})
    proc = subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "60"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (rd / "status.txt").read_text() == "SUCCESS\n"
    record = json.loads((rd / "cell.json").read_text())
    assert record["versions"]["router"].startswith(f"{program} ")
    assert len(record["scaleout"]["replicas"]) == 2
    assert record["scaleout"]["router"]["program"] == program
    for name in (
        "server.log",
        "server.r1.log",
        "router.log",
        "server_metrics.r0.csv",
        "server_metrics.r1.csv",
    ):
        assert (rd / name).stat().st_size > 0, name
    # The merged server metrics are the sum of the replicas' counters at the end of the run.
    last = [_rows(rd / f"server_metrics.r{i}.csv")[-1] for i in range(2)]
    merged = _rows(rd / "server_metrics.csv")[-1]
    for column in ("prompt_tokens_total", "prefix_cache_hits_total", "requests_finished_total"):
        assert float(merged[column]) == sum(float(row[column]) for row in last), column
    # The router's own per-replica counts cover every request the replicas finished.
    router = json.loads((rd / "router.json").read_text())
    assert router["program"] == program and router["policy"] == policy
    assert sum(router["requests_by_replica"]) >= float(merged["requests_finished_total"]) > 0
    if policy == "round_robin":  # consistent hashing may put a few sessions all on one replica
        assert all(n > 0 for n in router["requests_by_replica"])
    # The router was scraped through the run: its per-replica counts only grow, and end where
    # router.json's do.
    series = _rows(rd / "router_metrics.csv")
    assert len(series) >= 3 and list(series[0]) == ["time_s", "requests.r0", "requests.r1"]
    for name in ("requests.r0", "requests.r1"):
        values = [float(row[name]) for row in series]
        assert values == sorted(values), (name, values)
    totals = [float(row["requests.r0"]) + float(row["requests.r1"]) for row in series]
    assert totals[0] < totals[-1]  # (consistent hashing may leave one replica idle)
    assert [float(series[-1][f"requests.r{i}"]) for i in range(2)] == router["requests_by_replica"]
    if program == "smg":  # every request was placed by the session key the replayer sent
        assert router["policy_branches"] == {"routing_key_hit": sum(router["requests_by_replica"])}


def _write(path: Path, rows: list[tuple[float, float, int]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for t, usage, prompt in rows:
            values = {"kv_cache_usage": usage, "prompt_tokens_total": prompt, "requests_running": 1}
            writer.writerow([f"{t:.3f}"] + [str(values.get(c, "")) for c in COLUMNS[1:]])


def test_merge_sums_counters_averages_usage_and_leaves_gaps(tmp_path: Path) -> None:
    a, b, out = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "server_metrics.csv"
    _write(a, [(100.0, 0.2, 10), (101.0, 0.4, 20), (102.0, 0.6, 30), (103.0, 0.8, 40), (103.4, 0.8, 45)])
    # b missed its scrape near t=102 and took its last one a little later than a.
    _write(b, [(100.1, 0.0, 1), (101.1, 0.2, 2), (103.1, 0.2, 4), (103.5, 0.2, 5)])
    assert merge_metrics([a, b], out) == 4
    rows = _rows(out)
    assert [r["time_s"] for r in rows] == ["100.000", "101.000", "103.000", "103.400"]
    assert [int(r["prompt_tokens_total"]) for r in rows] == [11, 22, 44, 50]
    assert [float(r["kv_cache_usage"]) for r in rows] == [0.1, 0.30000000000000004, 0.5, 0.5]
    assert [r["requests_running"] for r in rows] == ["2", "2", "2", "2"]
    assert {r["cpu_cache_hits_total"] for r in rows} == {""}  # unknown stays unknown, never 0


def test_merge_of_a_replica_without_rows_is_header_only(tmp_path: Path) -> None:
    a, out = tmp_path / "a.csv", tmp_path / "server_metrics.csv"
    _write(a, [(100.0, 0.2, 10)])
    assert merge_metrics([a, tmp_path / "missing.csv"], out) == 0
    assert out.read_text().splitlines() == [",".join(COLUMNS)]
