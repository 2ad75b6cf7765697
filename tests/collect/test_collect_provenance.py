"""Collect and compare read each point's receipt and refuse to put points measured differently side by
side (another replayer version, one curve of two recipes, a matched cell whose recipe changed) unless
--allow-mixed, naming what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from agentsweep.cli import main
from agentsweep.contract.cell import Cell
from agentsweep.contract.receipt import read_receipt, write_receipt

from ..store.conftest import COMMIT, SMALL, make_sweep
from .conftest import Spec


def reseal(path: Path, *, replayer: str | None = None) -> None:
    """The cell's receipt written again, as another replayer version would have written it."""
    doc = json.loads((path / "cell.json").read_text())
    write_receipt(
        path,
        Cell.parse(doc["cell"]),
        engine_version=doc["versions"]["engine"],
        replayer=replayer,
        commit=COMMIT,
    )


def test_summary_csv_carries_each_points_provenance(tmp_path):
    paths = make_sweep(tmp_path / "a", SMALL)
    assert main(["collect", str(tmp_path / "a"), str(tmp_path / "out"), "--no-plots"]) == 0
    table = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("exp_name")
    for path in paths:
        receipt = read_receipt(path)
        row = table.loc[json.loads((path / "cell.json").read_text())["cell"]["exp_name"]]
        assert row["recipe_fingerprint"] == receipt.recipe_fingerprint
        assert row["replayer_version"] == receipt.replayer_version
        assert row["client_version"] == receipt.recipe.client_version == receipt.replayer_version
    assert (
        f"Replayer version (from the receipts) | {receipt.replayer_version} |"
        in (tmp_path / "out" / "summary.md").read_text()
    )


def test_collect_refuses_two_replayer_versions_unless_allowed(tmp_path, capsys):
    root, out = tmp_path / "a", tmp_path / "out"
    paths = make_sweep(root, SMALL)
    installed = read_receipt(paths[0]).replayer_version
    reseal(paths[1], replayer="9.9.9")
    assert main(["collect", str(root), str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("input error: ")
    name = paths[1].name.removeprefix("agentic_")
    assert f"replayer versions differ: {installed} (" in err and f"9.9.9 ({name})" in err
    assert "--allow-mixed" in err
    assert not out.exists()  # refused before anything is written
    assert main(["collect", str(root), str(out), "--no-plots", "--allow-mixed"]) == 0
    assert "allowed (--allow-mixed): replayer versions differ" in capsys.readouterr().err
    assert "Points measured differently (--allow-mixed)" in (out / "summary.md").read_text()
    assert set(pd.read_csv(out / "summary.csv")["replayer_version"]) == {installed, "9.9.9"}


def test_one_curve_of_two_engine_versions_is_refused_two_curves_are_not(tmp_path, capsys):
    root = tmp_path / "a"
    make_sweep(root, [Spec(users=2, offload="on"), Spec(users=2, offload="off")])
    make_sweep(root, [Spec(users=8, offload="off")], engine_version="sim-2.0")
    # offload=on and offload=off are two curves: their recipes differ by design.
    make_sweep(tmp_path / "b", [Spec(users=2, offload="on")])
    make_sweep(tmp_path / "b", [Spec(users=2, offload="off")], engine_version="sim-2.0")
    assert main(["collect", str(tmp_path / "b"), str(tmp_path / "out-b"), "--no-plots"]) == 0
    assert main(["collect", str(root), str(tmp_path / "out"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert (
        "one curve, different recipes: engine version sim-1.0 (demo-tp1-ep1-u2-off), "
        "sim-2.0 (demo-tp1-ep1-u8-off)" in err
    )


def test_a_point_without_receipt_beside_receipted_ones_is_refused_unless_allowed(tmp_path, capsys):
    root, out = tmp_path / "a", tmp_path / "out"
    paths = make_sweep(root, SMALL, failed=(SMALL[3].exp_name,))
    # A FAILED cell that died before its receipt is no point: nothing of it is compared.
    (paths[3] / "receipt.json").unlink()
    assert main(["collect", str(root), str(out), "--no-plots"]) == 1
    capsys.readouterr()
    # A point without one beside points with one: what measured it cannot be told.
    reseal(paths[1], replayer="9.9.9")
    (paths[1] / "receipt.json").unlink()
    assert main(["collect", str(root), str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--allow-mixed" in err
    assert f"1 point(s) without a receipt.json beside points with one ({SMALL[1].exp_name})" in err
    assert main(["collect", str(root), str(out), "--no-plots", "--allow-mixed"]) == 1
    table = pd.read_csv(out / "summary.csv").set_index("exp_name")
    assert table.loc[SMALL[1].exp_name, "status"] == "SUCCESS"
    assert "no receipt.json: not checked against one" in table.loc[SMALL[1].exp_name, "notes"]


def _collected(tmp_path: Path, name: str, **sweep) -> Path:
    root = tmp_path / name
    make_sweep(root, SMALL, **sweep)
    assert main(["collect", str(root), str(root / "aggregated"), "--no-plots"]) == 0
    return root


def test_compare_refuses_two_sweeps_of_different_replayer_versions(tmp_path, capsys):
    a = _collected(tmp_path, "a")
    b = _collected(tmp_path, "b", throughput=0.9)
    assert main(["compare", str(a / "aggregated"), str(b / "aggregated")]) == 0
    capsys.readouterr()
    installed = read_receipt(next(a.glob("agentic_*"))).replayer_version
    for path in b.glob("agentic_*"):
        reseal(path, replayer="9.9.9")
    assert main(["collect", str(b), str(b / "aggregated"), "--no-plots"]) == 0
    capsys.readouterr()
    assert main(["compare", str(a / "aggregated"), str(b / "aggregated")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"replayer versions differ: A {installed}, B 9.9.9" in err and "--allow-mixed" in err
    assert main(["compare", str(a / "aggregated"), str(b / "aggregated"), "--allow-mixed"]) == 0
    text = (b / "aggregated" / "compare.md").read_text()
    assert "Measured differently (--allow-mixed)" in text and "B 9.9.9" in text


def test_compare_refuses_matched_cells_whose_recipe_changed(tmp_path, capsys):
    a = _collected(tmp_path, "a")
    b = _collected(tmp_path, "b", engine_version="sim-2.0")
    assert main(["compare", str(a / "aggregated"), str(b / "aggregated")]) == 2
    err = capsys.readouterr().err
    assert "4 matched cell(s) have different recipes from A to B" in err
    assert "engine version sim-1.0 -> sim-2.0" in err
    assert main(["compare", str(a / "aggregated"), str(b / "aggregated"), "--allow-mixed"]) == 0
