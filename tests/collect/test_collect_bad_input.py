"""Bad input to collect / pareto / compare: one line naming what and where, exit status 2.

Each case here used to end in a traceback (an output folder below a file, an unwritable
$GITHUB_STEP_SUMMARY, `compare --on exp_name`), or to give a silently wrong result (`compare` pairing
cells at random when the keys do not identify them, `pareto` on an empty table).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err.splitlines()


@pytest.fixture
def two_sweeps(collected_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    """Two collected sweeps of the same 2 cells; B is 10 % faster in output throughput."""
    a, b = collected_pair
    b_csv = b / "summary.csv"
    df = pd.read_csv(b_csv)
    df["output_tok_per_s_per_gpu"] *= 1.1
    df.to_csv(b_csv, index=False)
    return a, b


def test_collect_out_dir_below_a_file(tmp_path: Path, cell_factory, spec_cls, capsys) -> None:
    cell_factory(tmp_path / "art", spec_cls())
    (tmp_path / "file.txt").write_text("x")
    out = tmp_path / "file.txt" / "agg"
    rc, err = _run(capsys, "collect", str(tmp_path / "art"), str(out), "--no-plots")
    assert (rc, err) == (2, [f"input error: {out}: cannot create: Not a directory"])


def test_collect_unwritable_step_summary(
    tmp_path: Path, cell_factory, spec_cls, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell_factory(tmp_path / "art", spec_cls())
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))  # a directory
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    rc, err = _run(capsys, "collect", str(tmp_path / "art"), str(tmp_path / "out"), "--no-plots")
    assert (rc, err) == (
        2,
        [f"input error: $GITHUB_STEP_SUMMARY ({tmp_path}): cannot append: Is a directory"],
    )


def test_pareto_refuses_a_summary_without_rows(tmp_path: Path, capsys) -> None:
    summary = tmp_path / "summary.csv"
    summary.write_text("exp_name,status,reason\n")
    rc, err = _run(capsys, "pareto", str(summary), str(tmp_path / "out"), "--no-plots")
    assert (rc, err) == (2, [f"input error: {summary}: summary.csv has no cell rows"])
    assert not (tmp_path / "out").exists()


def test_pareto_out_dir_is_a_file(two_sweeps: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, _ = two_sweeps
    (tmp_path / "taken").write_text("x")
    rc, err = _run(capsys, "pareto", str(a), str(tmp_path / "taken"), "--no-plots")
    assert (rc, err) == (2, [f"input error: {tmp_path / 'taken'}: exists and is not a directory"])


def test_compare_on_exp_name_matches_same_key_sweeps(
    two_sweeps: tuple[Path, Path], tmp_path: Path, capsys
) -> None:
    # The help names `--on exp_name` for same-key sweeps; it used to raise KeyError('exp_name_a').
    a, b = two_sweeps
    rc = main(["compare", str(a), str(b), "--on", "exp_name", "--out", str(tmp_path / "cmp")])
    capsys.readouterr()
    assert rc == 0
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert table["matched"].all() and len(table) == 2
    assert list(table["exp_name_a"]) == list(table["exp_name"]) == list(table["exp_name_b"])
    assert table["output_tok_per_s_per_gpu_ratio"].tolist() == pytest.approx([1.1, 1.1])


def test_compare_unknown_key_column(two_sweeps: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    a, b = two_sweeps
    rc, err = _run(capsys, "compare", str(a), str(b), "--on", "tp,colour", "--out", str(tmp_path / "c"))
    assert (rc, err) == (2, [f"input error: A ({a}): no column colour to match cells on (--on)"])


def test_compare_keys_that_do_not_identify_cells(
    two_sweeps: tuple[Path, Path], tmp_path: Path, capsys
) -> None:
    # Both cells have tp=1 and offload=on: matching on those alone would pair every A with every B.
    a, b = two_sweeps
    rc, err = _run(capsys, "compare", str(a), str(b), "--on", "tp,offload", "--out", str(tmp_path / "c"))
    assert rc == 2
    assert err == [
        f"input error: A ({a}): 2 cells share tp=1, offload=on (add config_key or use exp_name in --on "
        "so each cell is matched once)"
    ]


def test_compare_never_pairs_cells_without_keys(two_sweeps: tuple[Path, Path], tmp_path: Path) -> None:
    # A malformed cell has no tp/users/...: it is listed on its side, never matched to the other's.
    a, b = two_sweeps
    for path, name in ((a, "broken-a"), (b, "broken-b")):
        df = pd.read_csv(path / "summary.csv")
        extra = pd.DataFrame([{"exp_name": name, "status": "MALFORMED", "reason": "cell.json missing"}])
        pd.concat([df, extra], ignore_index=True).to_csv(path / "summary.csv", index=False)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert len(table) == 4 and int(table["matched"].sum()) == 2
    broken = table[~table["matched"]]
    assert sorted(broken["exp_name_a"].dropna()) == ["broken-a"]
    assert sorted(broken["exp_name_b"].dropna()) == ["broken-b"]
