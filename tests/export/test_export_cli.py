"""`agentsweep export` on collect's synthetic sweeps: which cells become rows (a capacity cell's steps,
not the cell), older summaries, bad input, cells that depart from their receipts and points measured
differently."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.export.schema import problems

from ..capacity.synthetic import capacity_dir
from ..collect.test_collect_provenance import reseal
from ..store.conftest import SMALL, make_sweep


def _export(root, out, *extra: str) -> int:
    return main(["export", "--format", "inferencex", str(root), "-o", str(out), *extra])


def test_only_success_points_unless_include_invalid_then_with_their_outcome(tmp_path, capsys):
    failed = SMALL[1].exp_name
    make_sweep(tmp_path / "a", SMALL, failed=[failed])
    assert _export(tmp_path / "a", tmp_path / "rows.json") == 0
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert sorted(r["exp_name"] for r in rows) == sorted(s.exp_name for s in SMALL if s.exp_name != failed)
    assert {r["outcome"] for r in rows} == {"SUCCESS"}
    assert f"{failed}: FAILED, not exported" in capsys.readouterr().err
    for shape in ("flat", "nested"):
        out = tmp_path / f"{shape}.json"
        assert _export(tmp_path / "a", out, "--shape", shape, "--include-invalid") == 0
        rows = json.loads(out.read_text())
        assert len(rows) == len(SMALL)
        assert {r["exp_name"]: r["outcome"] for r in rows}[failed] == "FAILED"
        assert all(problems(r, shape) == [] for r in rows)


def test_a_summary_written_before_the_new_figures_still_exports(tmp_path):
    # The synthetic cells' summaries hold no p75, std, full-response ITL, steady-window bounds or
    # stability block: those are null, interactivity comes from TPOT (the same figure per request).
    make_sweep(tmp_path / "a", SMALL[:1])
    assert _export(tmp_path / "a", tmp_path / "rows.json") == 0
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["p75_ttft"] is None and row["std_e2el"] is None and row["observed_window_count"] is None
    assert row["median_intvty"] == 1 / row["median_tpot"]
    assert row["median_itl"] is None and row["tput_per_gpu"] > 0


def test_no_cells_is_one_line_and_status_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert _export(tmp_path / "empty", tmp_path / "rows.json") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("input error: ") and "no cell result directories" in err
    assert not (tmp_path / "rows.json").exists()


def test_two_replayer_versions_are_refused_unless_allowed(tmp_path, capsys):
    paths = make_sweep(tmp_path / "a", SMALL)
    reseal(paths[1], replayer="9.9.9")
    assert _export(tmp_path / "a", tmp_path / "rows.json") == 2
    err = capsys.readouterr().err.strip()
    assert "replayer versions differ" in err and "--allow-mixed" in err
    assert not (tmp_path / "rows.json").exists()
    assert _export(tmp_path / "a", tmp_path / "rows.json", "--allow-mixed") == 0
    assert len(json.loads((tmp_path / "rows.json").read_text())) == len(SMALL)


def test_a_capacity_cell_exports_its_steps_not_itself(tmp_path, capsys):
    path = capacity_dir(tmp_path / "a")
    record = json.loads((path / "capacity.json").read_text())
    assert _export(tmp_path / "a", tmp_path / "rows.json") == 0
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert sorted((r["exp_name"], r["conc"]) for r in rows) == sorted(
        (s["exp_name"], s["users"]) for s in record["steps"]
    )
    assert all(r["p90_ttft"] is not None and r["tput_per_gpu"] > 0 for r in rows)
    err = capsys.readouterr().err
    assert "demo-tp1-ep1-u1to8-on: a capacity cell, not a point itself: its 6 steps are points" in err


def _break_receipt(kind: str, path: Path) -> str:
    """Make ``path`` depart from its receipt as ``kind`` says; what the row's reason then names."""
    if kind == "extra":
        (path / "notes.txt").write_text("added after the cell ended")
        return "does not match its receipt.json: notes.txt: extra"
    if kind == "missing":
        (path / "server_metrics.csv").unlink()
        return "does not match its receipt.json: server_metrics.csv: missing"
    if kind == "renamed":
        (path / "server_metrics.csv").rename(path / "server_metrics.old.csv")
        return "does not match its receipt.json: server_metrics.csv: missing"
    if kind == "changed":
        with (path / "requests.jsonl").open("a") as fh:
            fh.write("\n")
        return "does not match its receipt.json: requests.jsonl: changed"
    (path / "receipt.json").write_text("{ not json")
    return "receipt.json: not JSON"


@pytest.mark.parametrize("kind", ["extra", "missing", "renamed", "changed", "unreadable receipt"])
def test_a_cell_that_departs_from_its_receipt_is_not_exported(tmp_path, capsys, kind):
    paths = make_sweep(tmp_path / "a", SMALL)
    reason = _break_receipt(kind, paths[2])
    name = SMALL[2].exp_name
    assert _export(tmp_path / "a", tmp_path / "rows.json", "--include-invalid") == 0
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert sorted(r["exp_name"] for r in rows) == sorted(s.exp_name for s in SMALL if s.exp_name != name)
    assert f"export: {name}: MALFORMED, not exported" in capsys.readouterr().err
    # collect says the same of it, and why.
    assert main(["collect", str(tmp_path / "a"), str(tmp_path / "out"), "--no-plots"]) == 1
    table = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("exp_name")
    assert table.loc[name, "status"] == "MALFORMED" and reason in table.loc[name, "reason"]
    assert set(table.drop(name)["status"]) == {"SUCCESS"}


def test_a_point_without_receipt_beside_receipted_ones_is_refused_unless_allowed(tmp_path, capsys):
    paths = make_sweep(tmp_path / "a", SMALL)
    (paths[1] / "receipt.json").unlink()
    assert _export(tmp_path / "a", tmp_path / "rows.json") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--allow-mixed" in err
    assert f"1 point(s) without a receipt.json beside points with one ({SMALL[1].exp_name})" in err
    assert not (tmp_path / "rows.json").exists()
    assert _export(tmp_path / "a", tmp_path / "rows.json", "--allow-mixed") == 0
    assert len(json.loads((tmp_path / "rows.json").read_text())) == len(SMALL)
