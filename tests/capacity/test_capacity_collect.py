"""capacity.json as collect, export and ingest read it: held to its own contract, to the cell that wrote
it and to its steps on disk. One that breaks them makes the capacity cell MALFORMED (one line saying
why) and never reaches capacity.csv, the export or the store."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from agentsweep.cli import main

from tests.capacity.synthetic import capacity_dir, reseal


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """capacity.json changed and the cell's receipt written again over it: a writer's mistake, which
    the receipt does not catch."""
    data = json.loads((path / "capacity.json").read_text())
    change(data)
    (path / "capacity.json").write_text(json.dumps(data))
    reseal(path)


def _step(data: dict[str, Any], users: int) -> dict[str, Any]:
    return next(s for s in data["steps"] if s["users"] == users)


def _tier(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in data["tiers"] if t["tier"] == name)


def test_a_sound_capacity_cell_reaches_capacity_csv(tmp_path: Path) -> None:
    capacity_dir(tmp_path / "a")
    assert main(["collect", str(tmp_path / "a"), str(tmp_path / "out"), "--no-plots"]) == 0
    with open(tmp_path / "out" / "capacity.csv", newline="") as fh:
        rows = [(r["tier"], r["boundary_users"], r["boundary_type"]) for r in csv.DictReader(fh)]
    assert rows == [("roomy", "8", "at_least"), ("snappy", "5", "smooth")]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: _tier(d, "snappy").update(boundary_users=12, agents_per_gpu=12.0),
            "capacity.json: tiers 'snappy': boundary 12 users above the searched range 1..8",
        ),
        (
            lambda d: _tier(d, "snappy").update(agents_per_gpu=2.5),
            "capacity.json: tiers 'snappy': 2.5 agents per GPU for 5 users on 1 GPU(s)",
        ),
        (
            lambda d: d.update(steps=[s for s in d["steps"] if s["users"] != 5]),
            "capacity.json: tiers 'snappy': boundary 5 users has no SUCCESS step in 1..7",
        ),
        (
            lambda d: _step(d, 4).update(status="INVALID", reasons=["x"]),
            "capacity.json: steps[2]: 4 users INVALID, but steps/2 ran 4 users: SUCCESS",
        ),
        (
            lambda d: (
                d.update(gpus=2),
                [t.update(agents_per_gpu=t["boundary_users"] / 2) for t in d["tiers"]],
            ),
            "capacity.json: (exp_name, gpus, low, high) ('demo-tp1-ep1-u1to8-on', 2, 1, 8) but the cell's are "
            "('demo-tp1-ep1-u1to8-on', 1, 1, 8)",
        ),
        (
            lambda d: d.update(stop_reason="interrupted", tiers=[]),
            "capacity.json: a SUCCESS cell whose search stopped by 'interrupted' after 6 step(s)",
        ),
    ],
    ids=[
        "boundary above range",
        "agents per gpu",
        "boundary without its step",
        "step verdict",
        "gpus",
        "success interrupted",
    ],
)
def test_a_capacity_json_that_breaks_its_contract_never_reaches_the_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, change, expected: str
) -> None:
    monkeypatch.setenv("AGENTSWEEP_INGEST_WORKERS", "1")  # read in this process
    path = capacity_dir(tmp_path / "a")
    _edit(path, change)
    assert main(["collect", str(tmp_path / "a"), str(tmp_path / "out"), "--no-plots"]) == 1
    err = capsys.readouterr().err
    table = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("exp_name")
    row = table.loc["demo-tp1-ep1-u1to8-on"]
    assert row["status"] == "MALFORMED" and str(row["reason"]).startswith(expected), row["reason"]
    assert f"demo-tp1-ep1-u1to8-on: MALFORMED: {expected}" in err
    assert pd.read_csv(tmp_path / "out" / "capacity.csv").empty
    # The store refuses it in one line, and nothing is written.
    db = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["results", "ingest", "--db", db, str(tmp_path / "a")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and expected in line
    assert not (tmp_path / "store.db").exists()
