"""Collect checks a routed cell's artifacts against its plan, as it checks a single cell's: every planned
instance has its files, every file belongs to a planned instance, counters are numbers and only grow,
router_metrics.csv names only planned instances, and the merged tables are the sums of their instances.
Each failure is one `collect:` reason and the row is INVALID (it used to stay SUCCESS with blanks)."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.collect.aggregate import build_rows, to_frame
from agentsweep.collect.discover import find_cells

from .conftest import Spec, write_cell
from .routed_cells import pd_cell, routed_cell

SPEC = Spec(tp=1, users=4, offload="off")


def _row(root: Path) -> pd.Series:
    frame = to_frame(build_rows(find_cells(root)))
    assert len(frame) == 1
    return frame.iloc[0]


def _edit_csv(path: Path, row: int, column: str, value: str) -> None:
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    rows[row][rows[0].index(column)] = value
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)


def _router_metrics(path: Path, names: list[str]) -> None:
    lines = ["time_s," + ",".join(f"requests.{n}" for n in names)]
    lines += [f"{1_700_000_000 + t},{','.join(str(t * 3) for _ in names)}" for t in range(5)]
    (path / "router_metrics.csv").write_text("\n".join(lines) + "\n")


def _value(path: Path, row: int, column: str) -> float:
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    return float(rows[row][rows[0].index(column)])


CASES: list[tuple[str, Callable[[Path], object], str]] = [
    ("router.json deleted", lambda p: (p / "router.json").unlink(), "collect: router.json missing: a routed cell writes it"),
    (
        "an instance's metrics deleted",
        lambda p: (p / "server_metrics.r1.csv").unlink(),
        "collect: server_metrics.r1.csv missing: planned engine instance r1 left no scrapes",
    ),
    (
        "text in an instance's counter",
        lambda p: _edit_csv(p / "server_metrics.r0.csv", 7, "prompt_tokens_total", "many"),
        "collect: server_metrics.r0.csv: prompt_tokens_total='many' at time_s",
    ),
    (
        "a falling counter in an instance",
        lambda p: _edit_csv(p / "server_metrics.r1.csv", 9, "generation_tokens_total", "0"),
        "collect: server_metrics.r1.csv: generation_tokens_total goes down at time_s",
    ),
    (
        "an unknown instance in router_metrics.csv",
        lambda p: _router_metrics(p, ["r0", "r1", "r7"]),
        "collect: router_metrics.csv: counts requests for r7, not a planned engine instance (r0, r1)",
    ),
    (
        "a planned instance missing from router_metrics.csv",
        lambda p: _router_metrics(p, ["r0"]),
        "collect: router_metrics.csv: no column for planned instance(s) r1",
    ),
    (
        "a stray instance file",
        lambda p: (p / "server_metrics.r5.csv").write_text((p / "server_metrics.r0.csv").read_text()),
        "collect: server_metrics.r5.csv: belongs to no planned engine instance (the cell's instances are r0, r1)",
    ),
    (
        "a stray instance log",
        lambda p: (p / "server.r2.log").write_text("INFO\n"),
        "collect: server.r2.log: belongs to no planned engine instance",
    ),
    (
        "a merged table that is not the sum of its instances",
        lambda p: _edit_csv(p / "server_metrics.csv", 12, "prompt_tokens_total", "12345"),
        "collect: server_metrics.csv: prompt_tokens_total 12345.0 at time_s",
    ),
    (
        "a merged table with a row too few",
        lambda p: (p / "server_metrics.csv").write_text(
            "".join((p / "server_metrics.csv").read_text().splitlines(keepends=True)[:-1])
        ),
        "collect: server_metrics.csv: ",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("what", "breaks", "reason"), CASES, ids=[c[0] for c in CASES])
def test_a_routed_artifact_that_breaks_the_plan_makes_the_row_invalid(tmp_path, what, breaks, reason):
    path = routed_cell(tmp_path, SPEC)
    _router_metrics(path, ["r0", "r1"])
    assert _row(tmp_path)["status"] == "SUCCESS"  # as written: whole and consistent
    breaks(path)
    row = _row(tmp_path)
    assert row["status"] == "INVALID", what
    assert reason in row["reason"], row["reason"]
    assert "\n" not in row["reason"] and "Traceback" not in row["reason"]


def test_the_merged_table_names_its_instances_and_their_sum(tmp_path):
    path = routed_cell(tmp_path, SPEC)
    want = _value(path / "server_metrics.r0.csv", 12, "prompt_tokens_total") + _value(
        path / "server_metrics.r1.csv", 12, "prompt_tokens_total"
    )
    _edit_csv(path / "server_metrics.csv", 12, "prompt_tokens_total", "1")
    assert f"but its instances (r0, r1) sum to {want}" in _row(tmp_path)["reason"]


def test_a_disaggregated_cells_prefill_instances_and_merge_are_checked(tmp_path):
    path = pd_cell(tmp_path, SPEC)
    assert _row(tmp_path)["status"] == "SUCCESS"
    _edit_csv(path / "server_metrics.p0.csv", 5, "prompt_tokens_total", "x")
    row = _row(tmp_path)
    assert (
        row["status"] == "INVALID"
        and "collect: server_metrics.p0.csv: prompt_tokens_total='x'" in row["reason"]
    )
    path = pd_cell(tmp_path / "b", SPEC)
    _edit_csv(path / "server_metrics.prefill.csv", -1, "prefix_cache_hits_total", "1")
    row = _row(tmp_path / "b")
    assert row["status"] == "INVALID"
    assert "collect: server_metrics.prefill.csv: prefix_cache_hits_total 1.0 at time_s" in row["reason"]
    assert "but its instances (p0) sum to" in row["reason"]


def test_a_single_engine_cell_plans_no_instance_files(tmp_path):
    path = write_cell(tmp_path, SPEC)
    (path / "server_metrics.r0.csv").write_text((path / "server_metrics.csv").read_text())
    row = _row(tmp_path)
    assert row["status"] == "INVALID"
    assert (
        row["reason"]
        == "collect: server_metrics.r0.csv: belongs to no planned engine instance (the cell has one engine)"
    )


def test_collect_says_each_broken_routed_cell_on_one_line_and_exits_3(tmp_path, capsys):
    path = routed_cell(tmp_path / "art", SPEC)
    (path / "server_metrics.r1.csv").unlink()
    assert main(["collect", str(tmp_path / "art"), str(tmp_path / "out"), "--no-plots"]) == 3
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "INVALID" in ln]
    assert len(lines) == 1 and "collect: server_metrics.r1.csv missing" in lines[0]
