"""The dashboard in real headless Chromium with networking off: clicking a Pareto point opens its
drill-down, the percentile changes the plotted values, the overlay shows both runs, INVALID points
only when asked, history flags, and no console error anywhere."""

from __future__ import annotations

import json
import re

import pytest

from .browser import POINT_XY, offline_page
from .conftest import INVALID

pytestmark = [pytest.mark.chromium, pytest.mark.slow]
TIMEOUT_MS = 60_000


def _index(out):
    text = (out / "data" / "index.js").read_text()
    return json.loads(text[len("window.AGENTSWEEP_INDEX=") : -2])


def _traces(page, div):
    return page.evaluate(
        """(div) => document.getElementById(div).data.map(t => ({name: t.name, mode: t.mode, x: t.x, y: t.y,
             ids: t.customdata || [], color: t.marker ? t.marker.color : null, text: t.text || null}))""",
        div,
    )


def test_dashboard_in_headless_chromium(site):
    _, out = site
    index = _index(out)
    by_id = {p["id"]: p for p in index["points"]}
    with offline_page() as (page, errors, network):
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)

        # The Pareto explorer: the latest run of each scope, x = interactivity at p90 by default.
        traces = [t for t in _traces(page, "pareto") if t["mode"] == "markers"]
        shown = [i for t in traces for i in t["ids"]]
        assert shown and all(by_id[i]["status"] == "SUCCESS" for i in shown)
        first = traces[0]
        assert first["x"] == [by_id[i]["m"]["interactivity_p90_tok_per_s"] for i in first["ids"]]

        # Clicking a point opens its drill-down.
        trace_no = next(n for n, t in enumerate(_traces(page, "pareto")) if t["mode"] == "markers")
        x, y, point_id = page.evaluate(POINT_XY, ["pareto", trace_no, 0])
        page.mouse.click(x, y)
        page.wait_for_selector(f"#drilldown[data-drawn='1'][data-point='{point_id}']", timeout=TIMEOUT_MS)
        assert by_id[point_id]["exp_name"] in page.inner_text("#drill-title")
        timeline = _traces(page, "drill-timeline")
        assert {t["name"] for t in timeline} >= {"request (ok)", "first token"}
        assert len(next(t for t in timeline if t["name"] == "first token")["x"]) > 0
        assert {"GPU KV usage", "GPU hit rate"} <= {t["name"] for t in _traces(page, "drill-kv")}
        assert len(_traces(page, "drill-ttft")[0]["x"]) > 0

        # The percentile changes the plotted values (p50 of the same points).
        page.select_option("#percentile", "p50")
        page.wait_for_function("window.agentsweep.drawn >= 2", timeout=TIMEOUT_MS)
        after = next(
            t for t in _traces(page, "pareto") if t["name"] == first["name"] and t["mode"] == "markers"
        )
        assert after["ids"] == first["ids"]
        assert after["x"] == [by_id[i]["m"]["interactivity_p50_tok_per_s"] for i in after["ids"]]
        assert after["x"] != first["x"]
        page.select_option("#x-mode", "ttft")
        page.wait_for_function("window.agentsweep.drawn >= 3", timeout=TIMEOUT_MS)
        ttft = next(
            t for t in _traces(page, "pareto") if t["name"] == first["name"] and t["mode"] == "markers"
        )
        assert ttft["x"] == [by_id[i]["m"]["ttft_p50_s"] for i in ttft["ids"]]

        # INVALID points only when asked, greyed; a specific run shows its own INVALID cell.
        page.select_option("#run-filter", str(index["runs"][1]["id"]))
        page.wait_for_function("window.agentsweep.drawn >= 4", timeout=TIMEOUT_MS)
        assert "INVALID" not in [t["name"] for t in _traces(page, "pareto")]
        page.check("#show-invalid")
        page.wait_for_function("window.agentsweep.drawn >= 5", timeout=TIMEOUT_MS)
        grey = next(t for t in _traces(page, "pareto") if t["name"] == "INVALID")
        assert [by_id[i]["exp_name"] for i in grey["ids"]] == [INVALID]
        assert grey["color"] == index["style"]["invalid_color"]

        # The overlay shows both runs on the same axes, each with its own series.
        page.click("#tabs button[data-tab='overlay']")
        page.wait_for_function("window.agentsweep.drawn >= 6", timeout=TIMEOUT_MS)
        names = {t["name"] for t in _traces(page, "overlay") if t["mode"] == "markers"}
        assert {
            "run 1 · offload on",
            "run 2 · offload on",
            "run 1 · offload off",
            "run 2 · offload off",
        } <= names
        for trace in _traces(page, "overlay"):
            found = re.fullmatch(r"run (\d+) · offload (\w+)", trace["name"] or "")
            if found and trace["mode"] == "markers":
                assert {by_id[i]["run"] for i in trace["ids"]} == {int(found[1])}
                assert {by_id[i]["offload"] for i in trace["ids"]} == {found[2]}
                assert trace["color"] == index["style"]["offload_colors"][found[2]]
        # Each run's frontier names its points (TP and users), so overlaid runs read without hovering.
        labelled = [t for t in _traces(page, "overlay") if t["mode"] == "lines+text"]
        assert len(labelled) >= 4
        for trace in labelled:
            assert len(trace["text"]) == len(trace["x"])
            assert all(re.fullmatch(r"TP\d+ u\d+", text) for text in trace["text"]), trace["text"]

        # History: the flagged change is marked and listed.
        page.click("#tabs button[data-tab='history']")
        page.select_option("#history-metric", "ttft_p90_s")
        page.wait_for_function("window.agentsweep.drawn >= 8", timeout=TIMEOUT_MS)
        assert "flagged change" in {t["name"] for t in _traces(page, "history")}
        assert "CHANGED worse" in page.inner_text("#history-table")

        page.click("#tabs button[data-tab='capacity']")
        assert "No capacity results" in page.inner_text("#capacity")

        assert errors == []
        assert network == []


def test_drilldown_of_an_invalid_routed_point_shows_checks_and_instances(site):
    _, out = site
    index = _index(out)
    routed = next(p for p in index["points"] if p["router"])
    invalid = next(p for p in index["points"] if p["status"] == "INVALID")
    with offline_page() as (page, errors, network):
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
        for point in (routed, invalid):
            page.evaluate("(id) => window.agentsweepOpen(id)", point["id"])
            page.wait_for_selector(
                f"#drilldown[data-drawn='1'][data-point='{point['id']}']", timeout=TIMEOUT_MS
            )
            if point is routed:
                assert {t["name"] for t in _traces(page, "drill-router")} == {"r0", "r1"}
            else:
                checks = page.inner_text("#drill-checks")
                assert "throughput_drift" in checks and "FAIL" in checks and "0.5" in checks
        assert errors == [] and network == []


def test_a_large_cell_draws_its_requests_as_images(tmp_path):
    """Past 5,000 requests the request charts are canvas images on Plotly's axes (fast to paint)."""
    from agentsweep.cli import main

    from ..collect.conftest import Spec, requests_lines, write_cell
    from ..store.conftest import seal

    path = write_cell(tmp_path / "art", Spec(users=16))
    lines = []
    for line in requests_lines(Spec(users=16), n=6000):
        rec = json.loads(line)
        rec["t_done"] = rec["t_dispatch"] + (rec["e2e_s"] or 1.0)
        lines.append(json.dumps(rec))
    (path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    seal(path)
    db, out = tmp_path / "store.db", tmp_path / "site"
    assert main(["results", "ingest", "--db", str(db), str(tmp_path / "art")]) == 0
    assert main(["dashboard", "--db", str(db), "-o", str(out)]) == 0
    with offline_page() as (page, errors, network):
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
        page.evaluate("(id) => window.agentsweepOpen(id)", 1)
        page.wait_for_selector("#drilldown[data-drawn='1'][data-point='1']", timeout=TIMEOUT_MS)
        for div in ("drill-timeline", "drill-ttft", "drill-itl"):
            images = page.evaluate("(d) => document.getElementById(d).layout.images || []", div)
            assert len(images) == 1 and images[0]["source"].startswith("data:image/png;base64,"), div
        assert "6000 requests; request charts drawn as images" in page.inner_text("#drill-meta")
        assert errors == [] and network == []


def test_the_pareto_chart_is_on_screen_before_plotly_js(site):
    """The first paint draws every Pareto point as SVG while plotly.js is still loading; a click on
    one opens its drill-down as soon as Plotly is there; then Plotly draws the same points."""
    _, out = site
    by_id = {p["id"]: p for p in _index(out)["points"]}
    held = []
    with offline_page() as (page, errors, network):
        page.context.route("**/plotly.min.js", lambda route: held.append(route))
        page.goto((out / "index.html").as_uri(), wait_until="domcontentloaded")  # "load" waits for it
        page.wait_for_function("window.agentsweep.timings.first_paint !== undefined", timeout=TIMEOUT_MS)
        assert page.evaluate("typeof window.Plotly") == "undefined" and held
        circles = page.locator("#pareto svg.preview circle")
        preview = page.evaluate("window.agentsweep.preview")
        assert circles.count() == preview["points"] > 0
        first = circles.first
        point_id = int(first.get_attribute("data-point"))
        assert by_id[point_id]["exp_name"] in first.locator("title").text_content()
        first.click()
        assert page.inner_text("#drill-title") == "loading…"
        held[0].continue_()
        page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
        page.wait_for_selector(f"#drilldown[data-drawn='1'][data-point='{point_id}']", timeout=TIMEOUT_MS)
        assert page.locator("#pareto svg.preview").count() == 0
        plotted = [i for t in _traces(page, "pareto") if t["mode"] == "markers" for i in t["ids"]]
        assert len(plotted) == preview["points"]
        assert preview["series"] == [t["name"] for t in _traces(page, "pareto") if t["mode"] == "markers"]
        timings = page.evaluate("window.agentsweep.timings")
        assert timings["first_paint"] < timings["plotly_loaded"] <= timings["first_draw"]
        assert errors == [] and network == []
