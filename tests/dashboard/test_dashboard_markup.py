"""Markup in a result directory is shown as text and never runs: every string field a page shows
(model, precision, hardware, config key, engine version, run label, verdict reason, each check's
name, value, limit and reason) holds script-bearing markup; the dashboard (every tab and every
point's drill-down) and the report are opened in real headless Chromium, and no script of it runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.cli import main

from ..collect.conftest import Spec
from ..store.conftest import make_sweep, seal
from .browser import offline_page

pytestmark = [pytest.mark.chromium, pytest.mark.slow]
TIMEOUT_MS = 60_000


def mark(field: str) -> str:
    """Markup that, rendered as HTML anywhere, runs and counts itself in window.__ran."""
    return (
        f"<img src=x onerror=\"(window.__ran=window.__ran||[]).push('{field}')\">"
        f"<script>(window.__ran=window.__ran||[]).push('{field}-script')</script>{field}"
    )


FIELDS = ("model", "precision", "runner", "config_key", "image", "traces")


def poison(path: Path, invalid: bool) -> None:
    """Markup in every free-text field of one result directory (INVALID with a markup reason, or
    SUCCESS with markup in its passed checks), its receipt made again."""
    doc = json.loads((path / "cell.json").read_text())
    for name in FIELDS:
        doc["cell"][name] = mark(name)
    doc["versions"]["engine"] = mark("engine_version")
    reason = mark("reason")
    if invalid:
        doc["status"], doc["reason"] = "INVALID", reason
        (path / "status.txt").write_text(f"INVALID\n{reason}\n")
    (path / "cell.json").write_text(json.dumps(doc, indent=1))
    summary = json.loads((path / "summary.json").read_text())
    summary["validity"] = {
        "valid": not invalid,
        "reasons": [reason] if invalid else [],
        "checks": {
            mark("check_name"): {
                "value": mark("check_value"),
                "limit": mark("check_limit"),
                "ok": not invalid,
                "reason": mark("check_reason"),
            },
        },
    }
    (path / "summary.json").write_text(json.dumps(summary))
    seal(path)


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(sweep root, dashboard folder, report folder) of a store whose every text is markup."""
    tmp = tmp_path_factory.mktemp("markup")
    specs = [Spec(tp=1, users=u, offload="on") for u in (2, 8)]
    for night in ("a", "b"):
        paths = make_sweep(tmp / night, specs, start_utc=f"2026-01-0{1 if night == 'a' else 2}T00:00:00Z")
        for path in paths:
            poison(path, invalid="-u2-" in path.name)
    db = tmp / "store.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTSWEEP_INGEST_WORKERS", "1")
        for night in ("a", "b"):
            label = mark(f"label_{night}")
            assert main(["results", "ingest", "--db", str(db), str(tmp / night), "--label", label]) == 0
    site = tmp / "site"
    assert main(["dashboard", "--db", str(db), "-o", str(site)]) == 0
    report = tmp / "report"
    assert main(["collect", str(tmp / "a"), str(report)]) == 3  # a cell INVALID
    return tmp / "a", site, report


def _ran(page) -> list[str]:
    return page.evaluate("window.__ran || []")


def test_no_markup_from_the_store_runs_in_the_dashboard(poisoned):
    _, site, _ = poisoned
    index = json.loads((site / "data" / "index.js").read_text()[len("window.AGENTSWEEP_INDEX=") : -2])
    with offline_page() as (page, errors, _network):
        page.goto((site / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
        page.check("#show-invalid")
        page.wait_for_function("window.agentsweep.drawn >= 2", timeout=TIMEOUT_MS)
        for tab in ("overlay", "history", "capacity", "pareto"):
            page.click(f"#tabs button[data-tab='{tab}']")
            page.wait_for_timeout(300)
        for point in index["points"]:
            page.evaluate("(id) => window.agentsweepOpen(id)", point["id"])
            page.wait_for_selector(
                f"#drilldown[data-drawn='1'][data-point='{point['id']}']", timeout=TIMEOUT_MS
            )
            assert _ran(page) == []
            # The check's name, value, limit and reason are on the page, as text.
            checks = page.inner_text("#drill-checks")
            for field in ("check_name", "check_value", "check_limit", "check_reason"):
                assert "<img src=x onerror=" in checks and field in checks
        # Hover texts and legends reach Plotly escaped: it shows them, it does not parse them.
        texts = page.evaluate(
            "document.getElementById('pareto').data.flatMap(t => [t.name, ...(t.text || [])]).join(' ')"
        )
        assert "&lt;img src=x" in texts and "<img" not in texts
        history = page.inner_text("#history-table")
        assert "label_a" in history or "label_b" in history
        assert _ran(page) == []
        assert page.locator("img").count() == 0 and page.locator("main script").count() == 0
    assert not [e for e in errors if "__ran" in e]


def test_no_markup_from_a_result_directory_runs_in_the_report(poisoned):
    _, _, report = poisoned
    with offline_page() as (page, _errors, _network):
        page.goto((report / "report.html").as_uri())
        page.wait_for_load_state("load")
        text = page.inner_text("body")
        assert "<img src=x onerror=" in text and "model" in text
        assert _ran(page) == []
