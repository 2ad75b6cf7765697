"""The dashboard answers on its first screen (each run's headline, the same as its report's), names
every figure with its unit, says what its default view hides, keeps no panel of another tab on screen,
and shows a point's own figures in its drill-down."""

from __future__ import annotations

import json

import pytest
from agentsweep.cli import main
from agentsweep.collect.headline import from_files

from .browser import POINT_XY, offline_page

pytestmark = [pytest.mark.chromium, pytest.mark.slow]
TIMEOUT_MS = 60_000


def _index(out):
    text = (out / "data" / "index.js").read_text()
    return json.loads(text[len("window.AGENTSWEEP_INDEX=") : -2])


def test_each_runs_headline_is_the_reports_and_on_the_first_screen(site, tmp_path):
    _, out = site
    index = _index(out)
    newest = max(index["runs"], key=lambda r: (r["started"] or "", r["id"]))
    # The report of the same result directories says the same.
    assert main(["collect", str(out.parent / newest["label"]), str(tmp_path / "agg"), "--no-plots"]) in (0, 3)
    report = from_files(tmp_path / "agg")
    assert report is not None
    dash = index["headlines"][str(newest["id"])]
    assert [g["title"] for g in dash["groups"]] == [g.title for g in report.groups]
    for mine, theirs in zip(dash["groups"], report.groups, strict=True):
        assert mine["verdicts"] == theirs.verdicts
        assert [(t["description"], t["agents"], t["configuration"], t["binding"]) for t in mine["tiers"]] == [
            (t.description, t.agents, t.configuration, t.binding) for t in theirs.tiers
        ]
        assert [(lv["level"], lv["kind"], lv["output"]) for lv in mine["levels"]] == [
            (lv.level, lv.kind, lv.output) for lv in theirs.levels
        ]
    tiers = [t["description"] for g in dash["groups"] for t in g["tiers"]]
    assert len(tiers) == 3
    with offline_page((1366, 768)) as (page, errors, network):
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
        assert page.input_value("#headline-run") == str(newest["id"])
        rows = page.eval_on_selector_all(
            "#headline table.tiers tr:not(:first-child)",
            "rows => rows.map(r => [r.cells[0].textContent, r.getBoundingClientRect().bottom])",
        )
        assert [text for text, _ in rows] == tiers
        assert all(bottom <= 768 for _, bottom in rows), rows  # on the first screen, nothing scrolled
        # Another run's headline on demand.
        older = next(r for r in index["runs"] if r["id"] != newest["id"])
        page.select_option("#headline-run", str(older["id"]))
        first = index["headlines"][str(older["id"])]["groups"][0]
        assert first["verdicts"] in page.inner_text("#headline-body")
        assert errors == [] and network == []


def test_hover_names_each_figure_and_its_unit_and_the_default_view_says_what_it_hides(site):
    _, out = site
    index = _index(out)
    labels = index["metric_labels"]
    # The default view: the newest measurement of each point; the older ones are counted, not dropped
    # silently, and a point measured in one run only (the routed cell) stays.
    identities = {
        tuple(str(p[k]) for k in ("model", "hardware", "engine", "precision", "offload", "router", "shape",
                                  "config_key", "tp", "ep", "users", "gpus"))
        for p in index["points"]
    }  # fmt: skip
    older = len(index["points"]) - len(identities)
    assert older > 0
    with offline_page((1366, 900)) as (page, errors, network):
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
        note = page.inner_text("#pareto-note")
        assert f"{older} older measurement(s) of points measured again later" in note
        assert "1 INVALID point(s)" not in note or "tick the box" in note
        shown = [
            i
            for t in page.evaluate("document.getElementById('pareto').data")
            if t["mode"] == "markers"
            for i in t["customdata"]
        ]
        routed = next(p for p in index["points"] if p["router"])
        assert routed["id"] in shown  # measured in the older run only: still shown
        assert f"{len(shown)} of {len(index['points'])} point(s) shown" in note
        # Axes and hover name the metric and its unit.
        layout = page.evaluate("document.getElementById('pareto').layout")
        assert layout["xaxis"]["title"]["text"] == labels["interactivity_p90_tok_per_s"]
        assert layout["yaxis"]["title"]["text"] == labels["total_tok_per_s_per_gpu"]
        assert "(tok/s per user)" in labels["interactivity_p90_tok_per_s"]
        trace = next(n for n, t in enumerate(page.evaluate("document.getElementById('pareto').data"))
                     if t["mode"] == "markers")  # fmt: skip
        page.locator("#pareto").scroll_into_view_if_needed()
        x, y, _ = page.evaluate(POINT_XY, ["pareto", trace, 0])
        page.mouse.move(x, y)
        page.wait_for_selector("#pareto .hoverlayer .hovertext", timeout=TIMEOUT_MS)
        hover = page.locator("#pareto .hoverlayer").text_content() or ""
        for metric in ("interactivity_p90_tok_per_s", "total_tok_per_s_per_gpu", "output_tok_per_s_per_gpu"):
            assert labels[metric] in hover, (metric, hover)
        # One marker per TP, as the report's PNGs draw them.
        symbols = {
            tp: sym
            for t in page.evaluate("document.getElementById('pareto').data")
            if t["mode"] == "markers" and t["name"] != "INVALID"
            for tp, sym in zip(
                [next(p for p in index["points"] if p["id"] == i)["tp"] for i in t["customdata"]],
                t["marker"]["symbol"],
                strict=True,
            )
        }
        assert symbols == {tp: index["style"]["tp_symbols"][str(tp)] for tp in (1, 2)}
        # A log x axis where a tail dominates, or when asked.
        page.select_option("#x-scale", "log")
        page.wait_for_function("document.getElementById('pareto').layout.xaxis.type === 'log'")
        assert errors == [] and network == []


def test_no_panel_of_another_tab_stays_and_a_drilldown_shows_its_points_figures(site):
    _, out = site
    index = _index(out)
    labels = index["metric_labels"]
    plain = next(p for p in index["points"] if p["status"] == "SUCCESS" and not p["router"])
    with offline_page() as (page, errors, network):
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
        page.evaluate("(id) => window.agentsweepOpen(id)", plain["id"])
        page.wait_for_selector(f"#drilldown[data-drawn='1'][data-point='{plain['id']}']", timeout=TIMEOUT_MS)
        figures = page.inner_text("#drill-figures")
        assert labels["ttft_p90_s"] in figures and labels["output_tok_per_s_per_gpu"] in figures
        ttft = plain["m"]["ttft_p90_s"]
        assert (
            page.evaluate("(v) => (Math.abs(v) >= 1000 ? v.toFixed(0) : v.toPrecision(4))", ttft) in figures
        )
        assert not page.locator("#drill-router").is_visible()  # no empty router chart for one engine
        for tab in ("history", "capacity", "overlay", "compare"):
            page.click(f"#tabs button[data-tab='{tab}']")
            assert not page.locator("#drilldown").is_visible()
            assert not page.locator("#tab-pareto .controls").is_visible()
            assert page.locator("#axes").is_visible() is (tab == "overlay")
        page.click("#tabs button[data-tab='pareto']")
        assert page.locator("#tab-pareto .controls").is_visible()
        assert errors == [] and network == []
