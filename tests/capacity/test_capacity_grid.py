"""A run's SLO statistics from its requests.jsonl, and the capacity read off a grid of ordinary cells."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from agentsweep.capacity.grid import GridRun, grid_capacity
from agentsweep.capacity.measure import run_figures
from agentsweep.cell.record import write_result
from agentsweep.collect.capacity import capacity_results
from agentsweep.contract.cell import Cell
from agentsweep.contract.cellresult import CellIdentity, CellResult
from agentsweep.contract.resultdir import read_cell_record, read_status
from agentsweep.contract.slo import distinct_constraints, parse_tier_text, parse_tiers

CELL = Cell(
    exp_name="g-tp1-ep1-u4-off",
    engine="sim",
    model="m",
    tp=1,
    users=4,
    offload="off",
    duration=10,
    traces="t",
)


def write_run(
    path: Path, cell: Cell, ttfts: list[float], *, failed: int = 0, status: str = "SUCCESS"
) -> None:
    """A result directory whose profiled requests have these TTFTs (e2e = ttft + 1 s, 101 tokens)."""
    path.mkdir(parents=True)
    lines = [
        {"phase": "warmup", "status": "ok", "user": 0, "ttft_s": 99.0, "e2e_s": 100.0, "output_tokens": 101}
    ]
    for i, ttft in enumerate(ttfts):
        lines.append(
            {"phase": "profile", "status": "ok", "user": i % 2, "ttft_s": ttft, "e2e_s": ttft + 1.0,
             "output_tokens": 101, "prompt_tokens": 1000 * (i + 1)}
        )  # fmt: skip
    lines += [{"phase": "profile", "status": "error", "user": 1, "ttft_s": None} for _ in range(failed)]
    (path / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = {"schema_version": 1, "throughput": {"output_tok_per_s": 500.0, "total_tok_per_s": 5000.0}}
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "server.log").write_text("INFO [kv_cache_utils.py] GPU KV cache size: 160,000 tokens\n")
    reasons = [] if status == "SUCCESS" else ["failed_share: too many"]
    write_result(
        path, cell=cell.model_dump(mode="json"), engine_command=[], engine_env={}, replay_command=[],
        versions={}, start_utc="2026-01-01T00:00:00Z", status=status, reasons=reasons,  # type: ignore[arg-type]
    )  # fmt: skip


def test_statistics_follow_the_one_definition_and_the_engine_clock(tmp_path: Path) -> None:
    tiers = parse_tiers(
        {"t": ["ttft p90 <= 10 s", "speed p25 >= 20 tok/s", "errors <= 10 %", "e2e mean <= 9 s"]}
    )
    constraints = distinct_constraints(tiers)
    ttfts = [0.1 * (i + 1) for i in range(10)]  # 0.1 .. 1.0 s
    write_run(tmp_path / "r", CELL, ttfts, failed=2)
    figures = run_figures(tmp_path / "r", CELL, constraints)
    stats = figures.statistics
    assert stats["ttft:p90"] == pytest.approx(0.91, rel=0.01)  # warm-up and failed requests left out
    assert stats["output_speed:p25"] == pytest.approx(100.0, rel=0.01)  # (101 - 1) / (e2e - ttft)
    assert stats["error_share:mean"] == pytest.approx(2 / 12)
    assert stats["e2e:mean"] == pytest.approx(1.55, rel=0.01)
    assert figures.requests == 12
    # Per lane the largest context (prompt + output), summed: lane 0 (9000 + 101), lane 1 (10000 + 101).
    assert (figures.kv_working_set_tokens, figures.kv_pool_tokens) == (9101 + 10101, 160_000)
    assert figures.output_tok_per_s_per_gpu == 500.0
    # A simulated engine 10x faster than the wall clock: latencies x10, speeds and rates / 10.
    fast = CELL.replace(speed=10.0, gpus=2, tp=2)
    scaled = run_figures(tmp_path / "r", fast, constraints)
    assert scaled.statistics["ttft:p90"] == pytest.approx(9.1, rel=0.01)
    assert scaled.statistics["output_speed:p25"] == pytest.approx(10.0, rel=0.01)
    assert scaled.statistics["error_share:mean"] == pytest.approx(2 / 12)
    assert scaled.output_tok_per_s_per_gpu == pytest.approx(25.0)


def test_speed_percentiles_take_the_slow_tail_from_below(tmp_path: Path) -> None:
    # Speeds 100/k tok/s for k = 1..20: p25 is a slow one, p75 a fast one.
    path = tmp_path / "r"
    path.mkdir()
    lines = [
        {
            "phase": "profile",
            "status": "ok",
            "user": 0,
            "ttft_s": 0.0,
            "e2e_s": float(k),
            "output_tokens": 101,
        }
        for k in range(1, 21)
    ]
    (path / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    low, high = parse_tier_text("x: speed p25 >= 1 tok/s, speed p75 >= 1 tok/s").constraints
    stats = run_figures(path, CELL, [low, high]).statistics
    assert stats[low.key] < stats[high.key]
    assert stats[low.key] == pytest.approx(100 / 15.25, rel=0.02)


def runs(values: dict[int, float], invalid: tuple[int, ...] = ()) -> list[GridRun]:
    return [
        GridRun(u, "INVALID" if u in invalid else "SUCCESS", {"ttft:p90": v}, ("failed_share: 9 of 10",))
        for u, v in values.items()
    ]


def test_grid_boundary_is_interpolated_between_the_cells_around_it_and_marked() -> None:
    tier = parse_tier_text("t: ttft p90 <= 10 s")
    found = grid_capacity(tier, runs({2: 2.0, 4: 4.0, 8: 8.0, 16: 16.0}))
    assert found is not None
    assert (found.kind, found.boundary_users, found.passing, found.failing) == ("interpolated", 10, 8, 16)
    assert found.line("sim offload=off tp=1", 1) == (
        "tier t (TTFT p90 ≤ 10 s), sim offload=off tp=1 (grid): 10 agents per GPU (interpolated 8–15), "
        "bound by TTFT p90"
    )
    exact = grid_capacity(tier, runs({u: float(u) for u in range(8, 13)}))
    assert exact is not None and (exact.kind, exact.boundary_users) == ("exact", 10)
    # A validity failure above is not interpolated: the boundary is the last passing cell.
    bracketed = grid_capacity(tier, runs({2: 2.0, 4: 4.0, 8: 5.0, 16: 6.0}, invalid=(16,)))
    assert bracketed is not None and (bracketed.kind, bracketed.boundary_users, bracketed.binding) == (
        "bracketed", 8, "validity",
    )  # fmt: skip
    none = grid_capacity(tier, runs({2: 20.0, 4: 40.0}))
    assert none is not None and (none.kind, none.boundary_users) == ("none", 0)
    top = grid_capacity(tier, runs({2: 1.0, 4: 2.0}))
    assert top is not None and (top.kind, top.boundary_users) == ("at_least", 4)


def grid_series(tmp_path: Path) -> list[tuple[Cell, dict[str, Any]]]:
    """One series of four grid cells (2 to 16 users, TTFT p90 0.1 s per 2 users) and their collect rows."""
    out = []
    for users, p90 in ((2, 0.2), (4, 0.4), (8, 0.8), (16, 1.6)):
        cell = CELL.replace(users=users, exp_name=f"g-tp1-ep1-u{users}-off", config_key="g")
        path = tmp_path / cell.exp_name
        write_run(path, cell, [p90] * 10)
        row = {"exp_name": cell.exp_name, "status": "SUCCESS", "result_dir": str(path), "config_key": "g",
               "engine": "sim", "offload": "off", "router": "", "disagg": "", "tp": 1, "users": users,
               "capacity": None, "step_of": ""}  # fmt: skip
        out.append((cell, row))
    return out


def test_collect_reads_a_grid_capacity_per_series(tmp_path: Path) -> None:
    rows = [row for _cell, row in grid_series(tmp_path)]
    results = capacity_results(pd.DataFrame(rows), [parse_tier_text("t: ttft p90 <= 1 s")])
    assert list(results.table["source"]) == ["grid"]
    row = results.table.iloc[0]
    assert (row["cell"], row["tier"], row["boundary_type"], row["boundary_users"]) == (
        "sim offload=off tp=1", "t", "interpolated", 10,
    )  # fmt: skip
    assert results.lines == [
        "tier t (TTFT p90 ≤ 1 s), sim offload=off tp=1 (grid): 10 agents per GPU (interpolated 8–15), "
        "bound by TTFT p90"
    ]


def test_a_grid_member_with_its_cell_result_takes_the_cell_and_summary_from_it(tmp_path: Path) -> None:
    rows, results = [], {}
    for cell, row in grid_series(tmp_path):
        rows.append(row)
        path = Path(row["result_dir"])
        record, status = read_cell_record(path), read_status(path)
        assert record is not None and status is not None
        summary = json.loads((path / "summary.json").read_text())
        results[str(path)] = CellResult(path, CellIdentity(record, cell), status, None, summary)
    tier = [parse_tier_text("t: ttft p90 <= 1 s")]
    read = capacity_results(pd.DataFrame(rows), tier)
    for path in tmp_path.iterdir():  # what collect read is not read again
        (path / "cell.json").unlink()
        (path / "summary.json").unlink()
    held = capacity_results(pd.DataFrame(rows), tier, results)
    assert held.lines == read.lines and not held.notes
    pd.testing.assert_frame_equal(held.table, read.table)


def test_a_series_of_one_count_says_at_least_or_none_and_grid_rows_name_their_configuration(
    tmp_path: Path,
) -> None:
    rows = []
    for users, p90, offload, watts in (
        (2, 0.2, "on", 500.0),
        (2, 5.0, "off", None),
        (4, 0.3, "noprefix", 400.0),
    ):
        cell = CELL.replace(
            users=users, offload=offload, exp_name=f"g-tp1-ep1-u{users}-{offload}", config_key="g"
        )
        path = tmp_path / cell.exp_name
        write_run(path, cell, [p90] * 10)
        rows.append(
            {"exp_name": cell.exp_name, "status": "SUCCESS", "result_dir": str(path), "config_key": "g",
             "engine": "sim", "offload": offload, "router": "", "disagg": "", "tp": 1, "users": users,
             "capacity": None, "step_of": "", "model": "m", "runner": "h200", "replicas": 1,
             "avg_power_w": watts}
        )  # fmt: skip
    results = capacity_results(pd.DataFrame(rows), [parse_tier_text("t: ttft p90 <= 1 s")])
    table = results.table.set_index("offload")
    assert list(table["boundary_type"]) == ["at_least", "none", "at_least"]
    assert list(table["boundary_users"]) == [2, 0, 4]
    # Agents per MW: the boundary's users over the mean power of its cell (none where not measured).
    assert table.loc["on", "agents_per_mw"] == 2 / (500.0 / 1e6)
    assert table.loc["noprefix", "agents_per_mw"] == 4 / (400.0 / 1e6)
    assert pd.isna(table.loc["off", "agents_per_mw"])
    assert table.loc["off", "binding_text"] == "5 s" and table.loc["off", "binding_users"] == 2
    assert (
        set(table["model"]) == {"m"} and set(table["hardware"]) == {"h200"} and set(table["repeats"]) == {1}
    )
    assert (
        results.lines[1]
        == "tier t (TTFT p90 ≤ 1 s), sim offload=off tp=1 (grid): 0 agents per GPU: even 2 users miss it (bound by TTFT p90)"
    )
