"""The Capacity tab: per capacity cell its tiers and its steps as tables, and one chart per statistic
its steps measured (and output tok/s per GPU) against users, each tier's boundary marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.cli import main

from ..capacity.synthetic import capacity_dir
from .browser import offline_page

pytestmark = [pytest.mark.chromium, pytest.mark.slow]
TIMEOUT_MS = 60_000


def test_the_capacity_tab_charts_each_statistic_against_users_with_the_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTSWEEP_INGEST_WORKERS", "1")
    path = capacity_dir(
        tmp_path / "art", statuses=lambda index, users: "INVALID" if users == 8 else "SUCCESS"
    )
    record = json.loads((path / "capacity.json").read_text())
    keys = sorted({k for step in record["steps"] for k in step["statistics"]})
    bounds = sorted({t["boundary_users"] for t in record["tiers"] if t["boundary_users"]})
    assert keys and bounds
    db = tmp_path / "store.db"
    assert main(["results", "ingest", "--db", str(db), str(tmp_path / "art"), "--label", "cap"]) == 0
    out = tmp_path / "site"
    assert main(["dashboard", "--db", str(db), "-o", str(out)]) == 0
    text = (out / "data" / "index.js").read_text()
    labels = json.loads(text[len("window.AGENTSWEEP_INDEX=") : -2])["statistic_labels"]
    assert sorted(labels) == keys and labels["ttft:p90"] == "TTFT p90 (s)"
    with offline_page((1366, 900)) as (page, errors, network):
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
        drawn = page.evaluate("() => window.agentsweep.drawn")
        page.click("#tabs button[data-tab='capacity']")
        page.wait_for_function(f"() => window.agentsweep.drawn > {drawn}", timeout=TIMEOUT_MS)
        assert "agents per GPU" in page.inner_text("#capacity")
        charts = page.evaluate(
            """() => [...document.querySelectorAll('#capacity .capacity-plots .plot')].map(d => ({
              title: d.layout.title.text, xs: d.data.flatMap(t => t.x), crosses: d.data[1].x,
              lines: d.layout.shapes.map(s => s.x0)}))"""
        )
        assert [c["title"] for c in charts] == [labels[k] for k in keys] + [
            "Output throughput per GPU (tok/s)"
        ]
        steps = sorted(s["users"] for s in record["steps"])
        for chart in charts:
            assert sorted(chart["lines"]) == bounds
        assert sorted(charts[0]["xs"]) == steps
        assert charts[0]["crosses"] == [8]  # the INVALID step, a cross
        assert errors == [] and network == []
