"""A capacity cell through verify, ingest and the store's queries: its steps are result directories
with receipts of their own and points like any cell; the capacity cell keeps its capacity.json and
lies on no curve, in no history and in no diff itself."""

from __future__ import annotations

import json
import zlib

from agentsweep.cli import main
from agentsweep.store import query, schema
from agentsweep.store.db import Store
from sqlalchemy import select

from ..capacity.synthetic import capacity_dir
from .conftest import SMALL, make_sweep


def test_verify_matches_a_capacity_cell_and_each_of_its_steps(tmp_path, capsys):
    path = capacity_dir(tmp_path / "a")
    make_sweep(tmp_path / "a", SMALL[:1])
    assert main(["verify", str(tmp_path / "a")]) == 0
    assert "verify: 8 result directories match their receipts" in capsys.readouterr().err
    with (path / "steps" / "2" / "summary.json").open("a") as fh:
        fh.write(" ")
    assert main(["verify", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    # The step's own receipt and the capacity cell's (which covers its steps) both say so.
    assert f"{path / 'steps' / '2' / 'summary.json'}: changed" in err
    assert "verify: 2 of 8 result directories do not match their receipt" in err


def test_ingest_keeps_the_capacity_cell_and_its_steps_as_points(db_url, tmp_path, capsys):
    path = capacity_dir(tmp_path / "a")
    record = json.loads((path / "capacity.json").read_text())
    assert main(["results", "ingest", "--db", db_url, str(tmp_path / "a")]) == 0
    assert "7 points added" in capsys.readouterr().err
    store = Store.open(db_url)
    with store.read() as conn:
        points = query.load_points(conn)
        (cap_id,) = [p.id for p in points if p.capacity]
        kept = conn.execute(
            select(schema.blobs.c.name, schema.blobs.c.data).where(schema.blobs.c.point_id == cap_id)
        ).all()
    store.dispose()
    cap = next(p for p in points if p.capacity)
    assert (cap.exp_name, cap.status) == ("demo-tp1-ep1-u1to8-on", "SUCCESS") and cap.metrics == {}
    blobs = {name: zlib.decompress(data) for name, data in kept}
    assert json.loads(blobs["capacity.json"]) == record
    assert json.loads(blobs["drilldown.json"])["capacity"] == record
    steps = sorted((p for p in points if not p.capacity), key=lambda p: p.exp_name)
    assert [(p.position["users"], p.status) for p in steps] == [
        (s["users"], s["status"]) for s in sorted(record["steps"], key=lambda s: s["exp_name"])
    ]
    assert all(p.notes.startswith(f"step of capacity cell {cap.exp_name}") for p in steps)
    assert all(p.metrics["ttft_p90_s"] > 0 for p in steps)


def test_the_capacity_cell_lies_on_no_curve_history_or_diff(db_url, tmp_path, capsys):
    capacity_dir(tmp_path / "a")
    assert main(["results", "ingest", "--db", db_url, str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert main(["results", "curves", "--db", db_url, "--metric", "ttft_p90_s"]) == 0
    curve = capsys.readouterr().out
    # Six steps, one per count; the capacity cell (its users: the search's high count, 8) is none.
    assert curve.count("tp1/u") == 6 and curve.count("tp1/u8=") == 1 and "tp1/u8=-" not in curve
    assert main(["results", "history", "--db", db_url, "--metric", "ttft_p90_s"]) == 0
    history = capsys.readouterr().out
    assert "not judged" not in history and " u8 " in history
    assert main(["results", "diff", "1", "1", "--db", db_url, "--metric", "ttft_p90_s", "--check"]) == 0
    diff = capsys.readouterr().out
    assert "only in" not in diff and diff.count("ttft_p90_s") == 6
