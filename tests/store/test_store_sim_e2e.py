"""A real cell (run_cell.sh: simulated engine, scraper, replayer) sealed, verified, ingested, drawn."""

from __future__ import annotations

import json
import zlib

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.contract.cell import Cell
from agentsweep.contract.receipt import verify, write_receipt
from agentsweep.store import query, schema
from agentsweep.store.db import Store
from sqlalchemy import select

from ..collect.test_collect_sim_e2e import _run_cell

pytestmark = pytest.mark.slow


def test_a_real_cell_through_the_store(repo_root, tmp_path, capsys):
    results = tmp_path / "results"
    _run_cell(repo_root, results, 2, "off")
    (path,) = list((results / "e2e").iterdir())
    doc = json.loads((path / "cell.json").read_text())
    write_receipt(path, Cell.parse(doc["cell"]), engine_version=doc["versions"]["engine"])
    assert verify(path) == []

    db = tmp_path / "store.db"
    assert main(["results", "ingest", "--db", str(db), str(results / "e2e")]) == 0
    assert main(["collect", str(results / "e2e"), str(tmp_path / "agg"), "--no-plots"]) == 0
    row = pd.read_csv(tmp_path / "agg" / "summary.csv").iloc[0]
    store = Store.open(str(db))
    with store.read() as conn:
        (point,) = query.load_points(conn)
        blob = conn.execute(
            select(schema.blobs.c.data).where(schema.blobs.c.name == "drilldown.json")
        ).scalar_one()
    store.dispose()
    assert point.status == "SUCCESS" and point.scope["engine"] == "sim" and point.scope["engine_version"]
    for name in ("total_tok_per_s_per_gpu", "ttft_p90_s", "interactivity_p90_tok_per_s", "gpu_hit_rate"):
        assert point.metrics[name] == pytest.approx(float(row[name]), rel=1e-12), name
    payload = json.loads(zlib.decompress(blob))
    records = (path / "requests.jsonl").read_text().splitlines()
    assert payload["requests"]["total"] == len(records) > 0
    assert {c["name"] for c in payload["checks"]} >= {"failed_share", "window_coverage", "request_count_gap"}
    assert all(c["limit"] is not None or c["name"] == "server_metrics" for c in payload["checks"])
    # The engine's clock: a simulated cell at speed 50 reads like the simulated hardware.
    assert payload["clock_scale"] == 50.0
    first = json.loads(records[0])
    assert payload["requests"]["ttft"][0] == pytest.approx(first["ttft_s"] * 50, abs=1e-4)
    assert payload["server"]["kv"]["v"]
    assert main(["dashboard", "--db", str(db), "-o", str(tmp_path / "site")]) == 0
    assert (tmp_path / "site" / "data" / "points" / f"{point.id}.js").is_file()
