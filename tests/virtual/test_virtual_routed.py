"""Replicas behind a router on the virtual clock: the in-process router's policies, and a routed cell's
whole result directory (instances, merge, router files) judged and collected as a wall-clock one."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import read_status
from agentsweep.engine_sim import cli as engine_cli
from agentsweep.engine_sim.server import SimServer
from agentsweep.errors import InputError
from agentsweep.export.artifacts import AGGREGATE
from agentsweep.metrics.scrapes import merged_rows
from agentsweep.sweep.local import CellRun, run_in_process
from agentsweep.virtual.endpoint import RoutedEndpoint
from kv_cache_tester.replay.loop import SESSION_HEADERS


def _servers(n: int) -> list[SimServer]:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    args = parser.parse_args(
        ["meta-llama/Llama-3.3-70B-Instruct", "--tensor-parallel-size", "1", "--quantization", "fp8"]
    )
    return [engine_cli.build_server(args, engine_cli.resolve(args)) for _ in range(n)]


def _headers(session: str) -> dict[str, str]:
    return dict.fromkeys(SESSION_HEADERS, session)


def test_consistent_hash_keeps_each_session_on_one_engine_and_spreads_sessions() -> None:
    router = RoutedEndpoint(_servers(4), "consistent_hash", True, lambda: 0.0)
    sessions = [f"trace-{k}" for k in range(400)]
    first = {s: router.pick(_headers(s)) for s in sessions}
    assert all(router.pick(_headers(s)) == first[s] for s in sessions for _ in range(3))
    shares = [list(first.values()).count(i) / len(sessions) for i in range(4)]
    assert min(shares) > 0.15 and max(shares) < 0.35, shares  # 160 ring points each: roughly even


def test_round_robin_takes_the_engines_in_turn_and_random_is_seeded() -> None:
    servers = _servers(3)
    turn = RoutedEndpoint(servers, "round_robin", True, lambda: 0.0)
    assert [turn.pick(_headers("same")) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    draws = [RoutedEndpoint(servers, "random", True, lambda: 0.0, seed=7) for _ in range(2)]
    assert [draws[0].pick({}) for _ in range(20)] == [draws[1].pick({}) for _ in range(20)]


def test_power_of_two_takes_the_less_loaded_of_its_two_draws() -> None:
    servers = _servers(2)
    router = RoutedEndpoint(servers, "power_of_two", True, lambda: 0.0)
    for _ in range(3):  # engine 0 busy: three requests waiting (the engine is not started)
        servers[0].engine.submit(list(range(64)), 8)
    assert servers[0].engine.num_waiting == 3
    assert {router.pick({}) for _ in range(20)} == {1}


def test_a_policy_the_in_process_router_cannot_run_is_refused_in_one_line() -> None:
    with pytest.raises(InputError, match=r"router: cache_aware .*needs clock: wall"):
        Cell.parse(_cell_fields("cache_aware"))
    with pytest.raises(ValueError, match="router policy 'cache_aware'"):
        RoutedEndpoint(_servers(1), "cache_aware", True, lambda: 0.0)


def _cell_fields(router: str) -> dict[str, object]:
    return {
        "exp_name": f"routed-{router}", "config_key": "routed", "engine": "sim",
        "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "image": "",
        "traces": "kv-cache-tester/sample_traces", "max_context": 24576, "duration": 12, "speed": 50,
        "tp": 1, "users": 8, "offload": "off", "replicas": 2, "router": router, "clock": "virtual",
        "hardware": "h200",
    }  # fmt: skip


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
def test_a_routed_cell_on_the_virtual_clock_leaves_a_routed_cells_files_and_passes_its_checks(
    repo_root: Path, tmp_path: Path
) -> None:
    hit: dict[str, float] = {}
    for router in ("consistent_hash", "round_robin"):
        rd = tmp_path / "results" / f"routed-{router}"
        run = CellRun(Cell.parse(_cell_fields(router)), rd)
        run_in_process(run, repo_root)
        status = read_status(rd)
        assert status is not None and status.verdict == "SUCCESS", status
        # The router's counts: every request the client sent (profile and warm-up), as its last row holds them.
        record = json.loads((rd / "router.json").read_text())
        assert record["program"] == "in-process" and record["policy"] == router
        summary = json.loads((rd / "summary.json").read_text())
        sent = summary["counts"]["sent"] + summary["counts"]["warmup"]
        assert sum(record["requests_by_replica"]) == sent
        last = _rows(rd / "router_metrics.csv")[-1]
        assert [float(last["requests.r0"]), float(last["requests.r1"])] == record["requests_by_replica"]
        # server_metrics.csv is the merge of the two engines' own scrapes.
        merged = [rd / "server_metrics.r0.csv", rd / "server_metrics.r1.csv"]
        with (rd / "server_metrics.csv").open(newline="") as fh:
            assert list(csv.reader(fh))[1:] == merged_rows(merged)
        assert (rd / "server.log").is_file() and (rd / "server.r1.log").is_file()
        cell = json.loads((rd / "cell.json").read_text())
        assert cell["scaleout"]["router"]["program"] == "in-process"
        assert cell["versions"]["router"].startswith("in-process ")
    out = tmp_path / "collected"
    assert main(["collect", str(tmp_path / "results"), "-o", str(out), "--no-plots"]) == 0
    rows = {r["exp_name"]: r for r in _rows(out / "summary.csv")}
    for router in ("consistent_hash", "round_robin"):
        row = rows[f"routed-{router}"]
        assert row["status"] == "SUCCESS", row["reason"]
        assert row["router_busiest_share"] and row["replica_gpu_hit_min"]
        hit[router] = float(row["gpu_hit_rate"])
    # Session affinity keeps each session's prefix where it was computed: more of it hits.
    assert hit["consistent_hash"] > hit["round_robin"] + 0.05, hit
    # The export names the router that ran: this process's, not a router program.
    exported = tmp_path / "export"
    assert main(["export", str(tmp_path / "results"), "-o", str(exported), "--shape", "nested"]) == 0
    rows = json.loads((exported / AGGREGATE).read_text())
    assert {r["router"]["name"] for r in rows} == {"in-process"}


def test_a_disaggregated_cell_is_still_refused_on_the_virtual_clock() -> None:
    fields = {**_cell_fields("round_robin"), "replicas": 1, "prefill": {"tp": 1}, "decode": {"tp": 1}}
    with pytest.raises((ValueError, InputError), match="disaggregated"):
        Cell.parse(fields)


@pytest.mark.slow
def test_a_capacity_cell_of_replicas_searches_on_the_virtual_clock(repo_root: Path, tmp_path: Path) -> None:
    """Each step is a routed run of its own: its engines, its router files, its verdict."""
    fields = {**_cell_fields("consistent_hash"), "exp_name": "routed-capacity", "users": 6}
    loose = {
        "name": "loose",
        "constraints": [{"metric": "ttft", "stat": "p90", "op": "<=", "value": 60.0, "unit": "s"}],
    }
    fields["capacity"] = {"low": 2, "high": 6, "time_limit_min": 10, "tiers": [loose]}
    rd = tmp_path / "results" / "routed-capacity"
    run_in_process(CellRun(Cell.parse(fields), rd), repo_root)
    status = read_status(rd)
    assert status is not None and status.verdict == "SUCCESS", status
    steps = sorted((rd / "steps").iterdir())
    assert steps
    for step in steps:
        assert json.loads((step / "router.json").read_text())["program"] == "in-process"
        assert (step / "server_metrics.r1.csv").is_file() and (step / "server_metrics.csv").is_file()
    out = tmp_path / "collected"
    assert main(["collect", str(tmp_path / "results"), "-o", str(out), "--no-plots"]) == 0
    assert {r["status"] for r in _rows(out / "summary.csv")} == {"SUCCESS"}
