"""`agentsweep compare` holds to the input rules: numbers in summary.csv are checked (text, NaN,
infinities and negatives are one-line errors, as is a non-numeric `tp`), what it copies into
compare.md is escaped, a FIFO is refused without blocking, and cells match on every axis of a cell."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err.splitlines()


@pytest.fixture
def two_sweeps(collected_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    return collected_pair


def _edit(folder: Path, column: str, value: object, row: int = 0) -> str:
    df = pd.read_csv(folder / "summary.csv")
    df[column] = df[column].astype(object)
    df.loc[row, column] = value
    df.to_csv(folder / "summary.csv", index=False)
    return str(df.loc[row, "exp_name"])


@pytest.mark.parametrize("value", ["fast", "nan", "inf", "-3.5"])
def test_a_metric_that_is_not_a_finite_non_negative_number_is_refused(
    two_sweeps: tuple[Path, Path], tmp_path: Path, capsys, value: str
) -> None:
    a, b = two_sweeps
    cell = _edit(b, "ttft_p50_s", value)
    rc, err = _run(capsys, "compare", str(a), str(b), "--out", str(tmp_path / "c"))
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"input error: B ({b}): cell {cell}: ttft_p50_s: expected a finite number >= 0")
    assert not (tmp_path / "c" / "compare.md").exists()


def test_a_non_numeric_tp_is_one_line(two_sweeps: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, b = two_sweeps
    cell = _edit(a, "tp", "eight")
    rc, err = _run(capsys, "compare", str(a), str(b), "--out", str(tmp_path / "c"))
    assert (rc, err) == (
        2,
        [f"input error: A ({a}): cell {cell}: tp: expected a positive integer, got 'eight'"],
    )


def test_status_text_is_escaped_in_compare_md(two_sweeps: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, b = two_sweeps
    _edit(b, "status", "\x1b[31mFAILED\x1b[0m | <img src=x> **bold**")
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    md = (tmp_path / "c" / "compare.md").read_text()
    assert "\x1b" not in md and not re.search(r"(?<!\\)<img", md) and "**bold**" not in md
    assert r"FAILED \| \<img src=x\> \*\*bold\*\*" in md
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 2 and all(r.count(" | ") == rows[0].count(" | ") for r in rows)


def test_a_fifo_is_refused_without_blocking(two_sweeps: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, _ = two_sweeps
    fifo = tmp_path / "summary.csv"
    os.mkfifo(fifo)
    rc, err = _run(capsys, "compare", str(a), str(fifo), "--out", str(tmp_path / "c"))
    assert (rc, err) == (2, [f"input error: {fifo}: not a regular file"])


def test_a_routed_cell_never_matches_a_single_engine_cell(
    two_sweeps: tuple[Path, Path], tmp_path: Path, capsys
) -> None:
    a, b = two_sweeps
    _edit(b, "replicas", 2)
    _edit(b, "router", "round_robin")
    _edit(b, "gpus", 2)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    table = pd.read_csv(tmp_path / "c" / "compare.csv")
    assert len(table) == 3 and int(table["matched"].sum()) == 1
    md = (tmp_path / "c" / "compare.md").read_text()
    assert "| tp | ep | users | offload | replicas | router | gpus |" in md
    # Matching on the old columns only (an explicit --on) still pairs them, as asked.
    assert main(["compare", str(a), str(b), "--on", "tp,ep,users,offload", "--out", str(tmp_path / "d")]) == 0
    assert int(pd.read_csv(tmp_path / "d" / "compare.csv")["matched"].sum()) == 2
