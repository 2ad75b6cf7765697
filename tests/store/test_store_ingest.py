"""Ingest and queries against a real SQLite file and a real PostgreSQL server (the same tests)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.store import query, schema
from agentsweep.store.db import Store
from agentsweep.store.ingest import Source, ingest
from sqlalchemy import func, select

from ..collect.conftest import Spec
from .conftest import SMALL, make_sweep, seal


def _count(store: Store, table) -> int:
    with store.read() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _ingest(db_url: str, *dirs: Path, label: str | None = None) -> int:
    args = ["results", "ingest", "--db", db_url, *map(str, dirs)]
    return main(args + (["--label", label] if label else []))


def test_ingest_keeps_collects_figures_and_the_records(db_url, tmp_path):
    root = tmp_path / "artifacts"
    paths = make_sweep(root, failed=("demo-tp2-ep1-u32-noprefix",))
    assert _ingest(db_url, root) == 0
    store = Store.open(db_url)
    with store.read() as conn:
        points = query.load_points(conn)
        runs = query.list_runs(conn)
    assert len(points) == len(paths) == 18 and len(runs) == 1
    assert runs[0].points == 18 and runs[0].success == 17 and runs[0].started_utc == "2026-01-01T00:00:00Z"
    # The figures are collect's summary.csv, row for row.
    out = tmp_path / "agg"
    assert main(["collect", str(root), str(out), "--no-plots"]) in (0, 1)
    table = pd.read_csv(out / "summary.csv").set_index("exp_name")
    for point in points:
        row = table.loc[point.exp_name]
        assert point.status == row["status"]
        for name in ("total_tok_per_s_per_gpu", "ttft_p90_s", "gpu_hit_rate", "req_records"):
            if pd.isna(row[name]):
                assert name not in point.metrics
            else:
                assert point.metrics[name] == pytest.approx(float(row[name]), rel=1e-12)
    ok = next(p for p in points if p.exp_name == "demo-tp1-ep1-u8-on")
    assert (
        ok.scope["shape"] == "r1"
        and ok.scope["engine_version"] == "sim-1.0"
        and ok.scope["hardware"] == "simulated H200"
    )
    assert ok.position == {"tp": 1, "ep": 1, "users": 8, "gpus": 1}
    # requests.jsonl is kept byte for byte (compressed) and the drill-down derived from it.
    with store.read() as conn:
        parts = conn.execute(
            select(schema.blobs.c.data, schema.blobs.c.codec)
            .where(schema.blobs.c.point_id == ok.id, schema.blobs.c.name == "requests.jsonl")
            .order_by(schema.blobs.c.part)
        ).all()
        drill = conn.execute(
            select(schema.blobs.c.data).where(
                schema.blobs.c.point_id == ok.id, schema.blobs.c.name == "drilldown.json"
            )
        ).scalar_one()
    assert {codec for _, codec in parts} == {"zlib"}
    path = next(p for p in paths if p.name.endswith("u8-on"))
    assert b"".join(zlib.decompress(d) for d, _ in parts) == (path / "requests.jsonl").read_bytes()
    payload = json.loads(zlib.decompress(drill))
    records = [json.loads(line) for line in (path / "requests.jsonl").read_text().splitlines()]
    assert payload["requests"]["total"] == len(records)
    assert payload["requests"]["t"][:3] == [r["t_dispatch"] for r in records[:3]]
    assert payload["server"]["kv"]["v"] and payload["checks"] == []
    assert _count(store, schema.files) == sum(len(list(p.iterdir())) - 1 for p in paths)
    store.dispose()


def test_ingesting_twice_adds_nothing(db_url, tmp_path, capsys):
    root = tmp_path / "a"
    make_sweep(root, SMALL)
    assert _ingest(db_url, root) == 0
    assert _ingest(db_url, root) == 0
    assert "4 result(s) already in the store" in capsys.readouterr().err
    store = Store.open(db_url)
    assert _count(store, schema.points) == 4 and _count(store, schema.runs) == 1
    # A fifth cell later: only it is added.
    make_sweep(root, [Spec(tp=1, users=32, offload="on")])
    assert _ingest(db_url, root) == 0
    assert _count(store, schema.points) == 5
    store.dispose()


def test_a_result_that_no_longer_matches_its_receipt_is_refused_and_nothing_is_written(
    db_url, tmp_path, capsys
):
    good, bad = tmp_path / "good", tmp_path / "bad"
    make_sweep(good, SMALL)
    paths = make_sweep(bad, SMALL[:2])
    with (paths[1] / "summary.json").open("a") as fh:
        fh.write(" ")
    assert _ingest(db_url, good, bad) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{paths[1] / 'summary.json'}: changed: sha256 differs" in err and "refused" in err
    with pytest.raises(Exception, match="no store here yet"), Store.open(db_url).read():
        pass


def test_a_result_without_receipt_is_refused(db_url, tmp_path, capsys):
    paths = make_sweep(tmp_path / "a", SMALL[:1])
    (paths[0] / "receipt.json").unlink()
    assert _ingest(db_url, tmp_path / "a") == 2
    assert capsys.readouterr().err.strip() == (
        f"receipt error: {paths[0] / 'receipt.json'}: no receipt (the cell did not finish writing its result)"
    )


def test_results_without_receipt_may_be_left_out_by_name(db_url, tmp_path, capsys):
    paths = make_sweep(tmp_path / "a", SMALL)
    (paths[0] / "receipt.json").unlink()
    assert main(["results", "ingest", "--db", db_url, str(tmp_path / "a"), "--skip-without-receipt"]) == 0
    err = capsys.readouterr().err
    assert f"{paths[0] / 'receipt.json'}: no receipt; not ingested" in err and "3 points added" in err
    # A result that no longer matches its receipt is still refused.
    (paths[1] / "status.txt").write_text("INVALID\n")
    assert main(["results", "ingest", "--db", db_url, str(tmp_path / "a"), "--skip-without-receipt"]) == 2


def test_one_transaction_per_ingest(db_url, tmp_path):
    """A failure while writing the second source leaves the first unwritten too."""
    first, second = tmp_path / "first", tmp_path / "second"
    make_sweep(first, SMALL[:2])
    paths = make_sweep(second, SMALL[2:])
    doc = json.loads((paths[0] / "cell.json").read_text())
    (paths[0] / "cell.json").write_text(json.dumps({**doc, "schema_version": 99}))  # sealed as is
    seal(paths[0])
    store = Store.open(db_url)
    with pytest.raises(Exception, match="not a readable result"):
        ingest(store, [Source(first, "first", str(first)), Source(second, "second", str(second))])
    assert _ingest(db_url, first) == 0
    assert _count(store, schema.points) == 2
    store.dispose()


def _three_runs(db_url: str, tmp_path: Path, **head: float) -> None:
    spec = [Spec(tp=1, users=8, offload="on")]
    for i, (tput, lat) in enumerate(
        [(1.0, 1.0), (1.02, 0.99), (head.get("throughput", 1.0), head.get("latency", 1.0))]
    ):
        root = tmp_path / f"run{i}"
        make_sweep(root, spec, throughput=tput, latency=lat, start_utc=f"2026-01-0{i + 1}T00:00:00Z",
                   stability=head.get("stability") if i == 2 else None)  # fmt: skip
        assert _ingest(db_url, root, label=f"night{i}") == 0


def test_diff_flags_beyond_the_spread_of_repeated_runs_only(db_url, tmp_path, capsys):
    _three_runs(db_url, tmp_path, throughput=0.7)
    capsys.readouterr()
    assert (
        main(["results", "diff", "night1", "night2", "--db", db_url, "--metric", "total_tok_per_s_per_gpu"])
        == 0
    )
    out = capsys.readouterr().out
    # The base's repeats (nights 0 and 1, the head left out) spread 2 %; the head is 30 % lower.
    assert "CHANGED worse" in out and "repeats n=2" in out and "-31.4%" in out
    assert main(["results", "diff", "night1", "night2", "--db", db_url, "--check"]) == 1


def test_without_a_noise_figure_nothing_is_flagged(db_url, tmp_path, capsys):
    spec = [Spec(tp=1, users=8, offload="on")]
    for i, tput in enumerate((1.0, 0.5)):
        make_sweep(tmp_path / f"r{i}", spec, throughput=tput, start_utc=f"2026-01-0{i + 1}T00:00:00Z")
        assert _ingest(db_url, tmp_path / f"r{i}", label=f"night{i}") == 0
    capsys.readouterr()
    # One base run, no stability block: a 50 % drop is shown, not judged.
    assert main(["results", "diff", "night0", "night1", "--db", db_url, "--check"]) == 0
    out = capsys.readouterr().out
    assert "-50.0%" in out and "not judged" in out and "no noise figure" in out and "CHANGED" not in out


def test_stability_ranges_decide_when_present(db_url, tmp_path, capsys):
    # The head's latency is 3 % higher but its sub-windows vary +-10 %: within noise.
    _three_runs(db_url, tmp_path, latency=1.03, stability=0.10)
    capsys.readouterr()
    assert main(["results", "diff", "night0", "night2", "--db", db_url, "--metric", "ttft_p90_s"]) == 0
    out = capsys.readouterr().out
    assert "within noise" in out and "(stability)" in out


def test_stability_ranges_flag_a_change_outside_them(db_url, tmp_path, capsys):
    _three_runs(db_url, tmp_path, latency=1.5, stability=0.05)
    capsys.readouterr()
    assert main(["results", "diff", "night0", "night2", "--db", db_url, "--metric", "ttft_p90_s"]) == 0
    assert "CHANGED worse" in capsys.readouterr().out


def test_history_and_curves(db_url, tmp_path, capsys):
    _three_runs(db_url, tmp_path, throughput=0.7)
    capsys.readouterr()
    assert (
        main(
            [
                "results",
                "history",
                "--db",
                db_url,
                "--scope",
                "offload=on",
                "--metric",
                "total_tok_per_s_per_gpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5  # header, rule, three runs
    assert "night0" in out[2] and "night2" in out[4] and "CHANGED worse" in out[4]
    assert main(["results", "curves", "--db", db_url, "--latest"]) == 0
    out = capsys.readouterr().out
    assert "night2" in out and "night0" not in out and "engine=sim" in out
    assert main(["results", "curves", "--db", db_url, "--scope", "ofload=on"]) == 2
    assert "did you mean 'offload'" in capsys.readouterr().err
    assert main(["results", "runs", "--db", db_url]) == 0
    assert capsys.readouterr().out.count("night") == 3


def test_curves_group_points_by_scope_and_run(db_url, tmp_path):
    root = tmp_path / "a"
    make_sweep(root)
    assert _ingest(db_url, root) == 0
    store = Store.open(db_url)
    with store.read() as conn:
        points = query.load_points(conn, {"tp": "2"})
    curves = query.curves(points)
    assert len(curves) == 3  # one per offload mode
    assert {len(c.points) for c in curves} == {3}  # users 2, 8, 32
    assert all(p.position["tp"] == 2 for c in curves for p in c.points)
    store.dispose()


@pytest.mark.slow
def test_worker_processes_store_what_the_main_process_stores(tmp_path, monkeypatch):
    root = tmp_path / "a"
    make_sweep(root, failed=("demo-tp2-ep1-u32-noprefix",))
    stored = {}
    for workers in ("1", "2"):
        monkeypatch.setenv("AGENTSWEEP_INGEST_WORKERS", workers)
        db = tmp_path / f"w{workers}.db"
        assert _ingest(f"sqlite:///{db}", root) == 0
        store = Store.open(str(db))
        with store.read() as conn:
            points = query.load_points(conn)
            blobs = conn.execute(
                select(schema.blobs.c.name, schema.blobs.c.part, schema.blobs.c.raw_size, schema.blobs.c.data)
                .join(schema.points, schema.points.c.id == schema.blobs.c.point_id)
                .order_by(schema.points.c.receipt_id, schema.blobs.c.name, schema.blobs.c.part)
            ).all()
        store.dispose()
        stored[workers] = (
            sorted((p.receipt_id, p.status, sorted(p.metrics.items())) for p in points),
            [(n, part, size, zlib.decompress(data)) for n, part, size, data in blobs],
        )
    assert stored["1"] == stored["2"] and len(stored["1"][0]) == 18
    monkeypatch.setenv("AGENTSWEEP_INGEST_WORKERS", "none")
    assert _ingest(f"sqlite:///{tmp_path / 'x.db'}", root) == 2
