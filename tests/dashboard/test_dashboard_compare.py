"""Baseline against head: each run's throughput per GPU at the headline's interactivity levels, side by
side, with the change judged against both runs' noise as `results diff` judges it: a 20 % drop is worse
beyond noise, a rerun within noise is not flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.cli import main

from ..store.test_store_throughput_noise import _run
from .browser import offline_page

pytestmark = [pytest.mark.chromium, pytest.mark.slow]
TIMEOUT_MS = 60_000


def test_a_throughput_drop_is_worse_beyond_noise_and_a_rerun_is_within_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTSWEEP_INGEST_WORKERS", "1")
    db = tmp_path / "store.db"
    runs = {
        "base": _run(tmp_path / "base", "2026-01-01T00:00:00Z"),
        "rerun": _run(tmp_path / "rerun", "2026-01-02T00:00:00Z", throughput=1.01, jitter=0.05),
        "drop": _run(tmp_path / "drop", "2026-01-03T00:00:00Z", throughput=0.8),
    }
    for label, root in runs.items():
        assert main(["results", "ingest", "--db", str(db), str(root), "--label", label]) == 0
    out = tmp_path / "site"
    assert main(["dashboard", "--db", str(db), "-o", str(out)]) == 0
    text = (out / "data" / "index.js").read_text()
    index = json.loads(text[len("window.AGENTSWEEP_INDEX=") : -2])
    ids = {r["label"]: str(r["id"]) for r in index["runs"]}
    base_levels = index["headlines"][ids["base"]]["groups"][0]["levels"]
    compared = [lv for lv in base_levels if lv["output"] is not None]
    assert compared and all(lv["output_range"] for lv in compared)  # the store's noise reaches the levels
    with offline_page((1366, 900)) as (page, errors, network):
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
        page.click("#tabs button[data-tab='compare']")
        page.wait_for_function("() => window.agentsweep.compare !== undefined", timeout=TIMEOUT_MS)
        assert not page.is_visible("#axes")  # the Pareto axes do not apply here
        # By default: the newest run (the drop) against the newest older one sharing its hardware · model.
        assert (page.input_value("#compare-head"), page.input_value("#compare-base")) == (
            ids["drop"],
            ids["rerun"],
        )
        page.select_option("#compare-base", ids["base"])
        page.wait_for_function(f"() => document.querySelector('#compare-base').value === '{ids['base']}'")
        rows = page.evaluate("() => window.agentsweep.compare.filter(r => r.change !== null)")
        assert len(rows) == len(compared)
        for row in rows:
            assert row["change"] == pytest.approx(-0.2, abs=0.01)
            assert row["verdict"] == "worse beyond noise"
        table = page.inner_text("#compare-table")
        assert "worse beyond noise" in table and "-20.0 %" in table
        assert f"{len(rows)} level(s) compared: {len(rows)} worse" in page.inner_text("#compare-note")
        bars = page.evaluate("() => document.getElementById('compare').data.map(t => [t.name, t.y.length])")
        assert [n for _, n in bars] == [len(rows), len(rows)] and "baseline" in bars[0][0]
        # A rerun within noise is not flagged.
        page.select_option("#compare-head", ids["rerun"])
        page.wait_for_function(
            "() => window.agentsweep.compare.every(r => r.change === null || r.verdict === 'within noise')"
        )
        assert "0 worse and 0 better beyond noise" in page.inner_text("#compare-note")
        assert errors == [] and network == []
