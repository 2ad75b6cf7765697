"""Each engine instance of a routed cell judged on its own, from its own scrapes and the router's counts:
a frozen replica hidden by a healthy one is INVALID, with the instance named."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from pathlib import Path

import pytest
from agentsweep.contract.cell import Cell
from agentsweep.metrics.dialects import COLUMNS
from agentsweep.validity.instances import instance_checks

START = 1_700_000_000.0
CELL = Cell.parse(
    {
        "exp_name": "i-tp1-ep1-u4-off-r2-round_robin", "engine": "sim", "hardware": "h200", "model": "m", "tp": 1, "users": 4,
        "offload": "off", "duration": 30, "traces": "t", "replicas": 2, "router": "round_robin",
        "max_delay": 1.0,
    }
)  # fmt: skip
LIMIT_S = 11.0  # max_delay + 10 s


def _write(path: Path, rows: list[dict[str, float]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([row.get(c, 0.0) if c in row or c.endswith("_total") else 0.0 for c in COLUMNS])


def _scrapes(seconds: int = 32, *, frozen_from: float | None = None, idle: bool = False,
             skip: range = range(0), finished_per_s: float = 2.0) -> list[dict[str, float]]:  # fmt: skip
    """One scrape a second from 1 s before the window: tokens and requests go up while it is healthy;
    from ``frozen_from`` (window seconds) on it holds 3 requests and nothing moves."""
    rows, prompt, gen, done = [], 0.0, 0.0, 0.0
    for k in range(seconds + 1):
        t = START - 1 + k
        frozen = frozen_from is not None and t - START > frozen_from
        if not idle and not frozen:
            prompt, gen, done = prompt + 4000, gen + 300, done + finished_per_s
        if k - 1 in skip:
            continue
        running = 0.0 if idle else 3.0
        rows.append({"time_s": t, "requests_running": running, "prompt_tokens_total": prompt,
                     "generation_tokens_total": gen, "requests_finished_total": done})  # fmt: skip
    return rows


def _router(path: Path, sent: dict[str, float]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["time_s", *(f"requests.{n}" for n in sent)])
        writer.writerow([START - 1, *(0 for _ in sent)])
        writer.writerow([START + 31, *sent.values()])


def _checks(
    tmp_path: Path, r0: list, r1: list | None, sent: dict[str, float] | None = None, failures: int = 0
):
    _write(tmp_path / "server_metrics.r0.csv", r0)
    if r1 is not None:
        _write(tmp_path / "server_metrics.r1.csv", r1)
    _router(tmp_path / "router_metrics.csv", sent or {"r0": 64.0, "r1": 64.0})
    checks = instance_checks(tmp_path, CELL, START, START + 30, failures, LIMIT_S)
    failed = {name: c.reason for name, c in checks.items() if not c.ok}
    return checks, failed


def test_two_healthy_replicas_pass(tmp_path):
    checks, failed = _checks(tmp_path, _scrapes(), _scrapes())
    assert failed == {}
    assert set(checks) == {
        "instance_metrics", "instance_coverage", "instance_stalls", "instance_scrape_gaps", "instance_request_counts",
    }  # fmt: skip


def test_a_frozen_replica_is_named(tmp_path):
    _, failed = _checks(
        tmp_path, _scrapes(), _scrapes(frozen_from=15.0), sent={"r0": 64, "r1": 35}, failures=3
    )
    assert failed["instance_coverage"] == (
        "r1: 15.0 of 30.0 window seconds with requests produced no token (coverage 50.0%, limit 95%)"
    )
    assert failed["instance_stalls"] == (
        "r1: requests in flight and no progress for 15.0 s (engine clock; limit 11 s)"
    )
    # A shorter freeze than the stall limit is still uncovered time.
    _, failed = _checks(
        tmp_path, _scrapes(), _scrapes(frozen_from=25.0), sent={"r0": 64, "r1": 55}, failures=3
    )
    assert set(failed) == {"instance_coverage"}


def test_an_idle_replica_is_the_routers_choice_not_a_stall(tmp_path):
    _, failed = _checks(tmp_path, _scrapes(), _scrapes(idle=True), sent={"r0": 64, "r1": 0})
    assert failed == {}


def test_a_replica_that_stops_answering_its_metrics_is_named(tmp_path):
    _, failed = _checks(tmp_path, _scrapes(), _scrapes(skip=range(5, 20)))
    assert set(failed) == {"instance_scrape_gaps"}
    assert failed["instance_scrape_gaps"] == (
        "r1: no scrape answered for 16 s of the window (engine clock; 16.0 s wall, scrapes every 1.0 s; "
        "limit 11 s, the stall limit): the instance did not answer its /metrics"
    )


@pytest.mark.parametrize(
    ("sent", "failures", "reason"),
    [
        ({"r0": 64, "r1": 50}, 0, "r1 finished 64 requests but the router sent it 50"),
        (
            {"r0": 64, "r1": 50},
            3,
            "r1 finished 64 requests but the router sent it 50 and the client gave up on or saw fail only 3",
        ),
        ({"r0": 64, "r1": 62}, 2, None),  # two the client gave up on finished, uncounted by the router
        (
            {"r0": 64, "r1": 90},
            3,
            "the router sent r1 90 requests, it finished 64 and the client saw only 3 fail",
        ),
        ({"r0": 64, "r1": 90}, 26, None),
        ({"r0": 64, "r1": 64.5}, 0, None),
    ],
)
def test_the_routers_counts_against_each_replicas(tmp_path, sent, failures, reason):
    _, failed = _checks(tmp_path, _scrapes(), _scrapes(), sent=sent, failures=failures)
    assert failed.get("instance_request_counts") == reason


def test_a_missing_or_broken_instance_file_is_named(tmp_path):
    _, failed = _checks(tmp_path, _scrapes(), None)
    assert failed["instance_metrics"] == "r1: server_metrics.r1.csv missing (not judged on its own)"
    rows = _scrapes()
    rows[5]["generation_tokens_total"] = 1.0
    _, failed = _checks(tmp_path, _scrapes(), rows)
    assert failed["instance_metrics"].startswith(
        "r1: server_metrics.r1.csv: generation_tokens_total goes down"
    )


def test_disaggregated_instances_are_judged_by_their_names(tmp_path):
    cell = CELL.replace(
        exp_name="i-pd", prefill={"tp": 1, "replicas": 1}, decode={"tp": 1, "replicas": 1}, replicas=1
    )
    for name, rows in (("p0", _scrapes(frozen_from=5.0)), ("d0", _scrapes())):
        _write(tmp_path / f"server_metrics.{name}.csv", rows)
    _router(tmp_path / "router_metrics.csv", {"p0": 40, "d0": 64})
    checks = instance_checks(tmp_path, cell, START, START + 30, 0, LIMIT_S)
    assert checks["instance_coverage"].reason.startswith("p0: 25.0 of 30.0 window seconds")
    assert not checks["instance_coverage"].ok


# --- a real frozen replica: the simulated engine with --stall-after behind a real router -------------


def _routed_cell(repo_root: Path) -> Cell:
    return Cell.parse(
        {
            "config_key": "fz", "exp_name": "fz-tp1-ep1-u16-off-r2-consistent_hash", "runner": "local",
            "engine": "sim", "hardware": "h200", "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "tp": 1,
            "users": 16, "offload": "off", "duration": 20,
            "traces": str(repo_root / "kv-cache-tester" / "sample_traces"), "max_context": 65536,
            "max_delay": 1, "warmup_requests": 0, "speed": 50, "engine_args": "--num-gpu-blocks-override 4096",
            "replicas": 2, "router": "consistent_hash", "router_program": "vllm-router",
            # Room for what a frozen replica also does to the cell as a whole (its lanes' requests fail
            # once each, their prompts were computed): here only the per-instance checks may catch it.
            # The hash ring is placed by the replicas' (free, so random) ports: with 16 sessions the
            # healthy replica keeps at least four of them in all but about one run in a hundred.
            "max_failed_share": 0.35, "max_prompt_token_gap": 0.3, "max_cached_token_gap": 0.9,
            "max_throughput_drift": 5.0, "max_dispatch_lag_p99_s": 2.0,
        }
    )  # fmt: skip


@pytest.mark.slow
def test_a_frozen_replica_behind_a_real_router_makes_the_cell_invalid(repo_root, tmp_path):
    from agentsweep.cell.lifecycle import run_cell
    from agentsweep.cell.plan import CellOptions, plan_cell
    from agentsweep.cell.port_allocation import FreePortAllocator

    plan = plan_cell(
        _routed_cell(repo_root), tmp_path / "cell", ports=FreePortAllocator(), python=sys.executable
    )
    r0, r1 = plan.instances
    frozen = dataclasses.replace(
        r1, engine=dataclasses.replace(r1.engine, argv=[*r1.engine.argv, "--stall-after", "8"])
    )
    status, _ = run_cell(
        dataclasses.replace(plan, instances=[r0, frozen]),
        CellOptions(health_timeout_s=60),
        log=lambda _: None,
    )
    reasons = (plan.result_dir / "status.txt").read_text().splitlines()[1:]
    assert status == "INVALID", reasons
    checks = json.loads((plan.result_dir / "summary.json").read_text())["validity"]["checks"]
    # The cell as a whole looks healthy: the healthy replica covers the window, the stuck lanes are busy.
    for name in ("window_coverage", "lanes_active", "failed_share", "request_count_gap"):
        assert checks[name]["ok"], (name, checks[name])
    assert any(r.startswith("instance_coverage: r1: ") for r in reasons), reasons
    assert any(r.startswith("instance_stalls: r1: requests in flight and no progress") for r in reasons), (
        reasons
    )
    assert checks["instance_scrape_gaps"]["ok"] and checks["instance_request_counts"]["ok"]


def test_a_replica_frozen_past_the_stall_limit_in_engine_time_is_named(tmp_path):
    """A sped-up cell (50x): r1 answers no scrape for 3.6 s of wall time, 180 engine seconds, while its
    requests wait; its counters rise across the gap (it catches up when it resumes). The stall limit is
    120 engine seconds: r1 stalled, though 3.6 s is under five 1-s scrape intervals."""
    cell = CELL.replace(speed=50.0)
    r1 = [row for row in _scrapes() if not START + 10.0 < row["time_s"] < START + 13.6]
    r1.append({**r1[11], "time_s": START + 13.6})  # the first answer after the freeze
    r1.sort(key=lambda row: row["time_s"])
    _write(tmp_path / "server_metrics.r0.csv", _scrapes())
    _write(tmp_path / "server_metrics.r1.csv", r1)
    _router(tmp_path / "router_metrics.csv", {"r0": 64.0, "r1": 64.0})
    checks = instance_checks(tmp_path, cell, START, START + 30, 0, 120.0)
    gaps = checks["instance_scrape_gaps"]
    assert not gaps.ok and gaps.value == pytest.approx(180.0) and gaps.limit == 150.0
    assert gaps.reason == (
        "r1: no scrape answered for 180 s of the window (engine clock; 3.6 s wall, scrapes every 1.0 s; "
        "limit 150 s, 3 scrape intervals, the shortest stall the scrapes resolve (stall limit 120 s)): the "
        "instance did not answer its /metrics"
    )
    # Healthy replicas, and a single missed scrape (2 s wall, 100 engine seconds), pass.
    one_missed = [row for row in _scrapes() if row["time_s"] != START + 10.0]
    _write(tmp_path / "server_metrics.r1.csv", one_missed)
    assert instance_checks(tmp_path, cell, START, START + 30, 0, 120.0)["instance_scrape_gaps"].ok
