"""report.html's layout: a summary table readable at 1,366 px (identity columns that stay, column sets
that can be hidden), capacity steps in user order with their runs, and one marker per TP and one
colour per offload mode whatever else a chart holds."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.collect.plots import OFFLOAD_COLORS, _series_styles, _styles, _title
from agentsweep.contract.resultdir import StepRecord, step_dir, write_capacity
from agentsweep.style import TP_MARKERS, tp_marker

from tests.capacity.synthetic import _verdict, capacity_cell, search_record, write_step
from tests.dashboard.browser import offline_page

pytestmark = pytest.mark.slow


def test_a_tp_keeps_its_marker_and_an_offload_mode_its_colour_whatever_the_chart_holds() -> None:
    only_tp2 = pd.DataFrame([{"tp": 2, "engine": "sim", "offload": "off"}])
    both = pd.DataFrame([{"tp": t, "engine": "sim", "offload": o} for t, o in ((1, "on"), (2, "off"))])
    assert _styles(only_tp2)[0] == {"2": TP_MARKERS[2][0]}
    assert _styles(both)[0] == {"1": TP_MARKERS[1][0], "2": TP_MARKERS[2][0]}
    assert TP_MARKERS[1][0] != TP_MARKERS[2][0]
    assert _series_styles(only_tp2)[("off", "", "")][0] == OFFLOAD_COLORS["off"]
    assert _series_styles(both)[("off", "", "")][0] == OFFLOAD_COLORS["off"]
    assert tp_marker(3) == tp_marker(3.0) and tp_marker(3) not in TP_MARKERS.values()


def _repeated_capacity_dir(root: Path) -> Path:
    """A capacity cell whose search ran each count twice (steps in search order: 1, 2, 4, 8, 6, 5)."""
    cell = capacity_cell(repeats=2)
    path = root / f"agentic_{cell.exp_name}"
    path.mkdir(parents=True)
    done = []
    for users in (1, 2, 4, 8, 6, 5):
        for repeat in range(2):
            index = len(done)
            step = write_step(path, cell, index, users)
            done.append(
                StepRecord(index=index, users=users, repeat=repeat, dir=f"steps/{index}", exp_name=step.exp_name,
                           status="SUCCESS", statistics={"ttft:p90": 0.04 * users + 0.1}, wall_s=70.0)
            )  # fmt: skip
            assert step_dir(path, index).is_dir()
    write_capacity(path, search_record(cell, done))
    _verdict(path, cell, "SUCCESS", ())
    return path


def test_a_figures_title_names_the_hardware_by_its_label_not_the_runner() -> None:
    rows = [
        {
            "config_key": "demo",
            "model": "m",
            "runner": "local",
            "hardware": "h200",
            "hardware_label": "simulated H200",
        },
        {"config_key": "demo", "model": "m", "runner": "b300", "hardware": "b300", "hardware_label": ""},
    ]
    assert _title(pd.DataFrame(rows)) == "demo · m · b300, simulated H200"
    assert _title(pd.DataFrame([{"config_key": "k", "model": "m", "runner": "local"}])) == "k · m · local"


def test_capacity_steps_read_in_user_order_with_their_runs(tmp_path: Path) -> None:
    _repeated_capacity_dir(tmp_path / "art")
    assert main(["collect", str(tmp_path / "art"), str(tmp_path / "out"), "--no-plots"]) == 0  # tables read
    md = (tmp_path / "out" / "summary.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| demo-tp1-ep1-u1to8-on")]
    assert rows[0].split(" | ")[3] == "1–8 (search)"  # the capacity cell: its searched range
    users = [row.split(" | ")[3] for row in rows[1:]]
    assert users == [f"{u} (run {r}/2)" for u in (1, 2, 4, 5, 6, 8) for r in (1, 2)]
    # Steps are counted apart from the cells.
    assert "| Cells | 1 SUCCESS |" in md and "| Capacity steps | 12 SUCCESS |" in md
    html = (tmp_path / "out" / "report.html").read_text()
    steps = html.split("Steps of demo-tp1-ep1-u1to8-on, in user order")[1].split("</table>")[0]
    cells = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td>", steps)
    assert cells == [(str(u), "2") for u in (1, 2, 4, 5, 6, 8)]
    assert "one run per count" not in html.split('id="capacity"')[1].split("Steps of")[0]
    assert "at least 2 runs per count" in html


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.collect.conftest import GRID, write_cell

    root = tmp_path_factory.mktemp("sweep") / "artifacts"
    for spec in GRID:
        write_cell(root, spec)
    out = root.parent / "aggregated"
    assert main(["collect", str(root), str(out)]) == 0
    return out


IDENTITY = """() => [...document.querySelectorAll('table.summary tr:nth-child(3) td.c-identity')].map(td => {
  const box = td.getBoundingClientRect(); return [box.left, box.right]; })"""


@pytest.mark.chromium
def test_the_summary_tables_identity_columns_stay_on_screen_at_1366_px(collected: Path) -> None:
    with offline_page((1366, 768)) as (page, errors, network):
        page.goto((collected / "report.html").as_uri())
        page.locator("#summary").scroll_into_view_if_needed()
        # The page itself never scrolls sideways; only the table's own box does.
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        before = page.evaluate(IDENTITY)
        assert len(before) == 5 and all(left >= 0 and right <= 1366 for left, right in before), before
        scroller = page.locator("#summary-scroll")
        width = page.evaluate("document.getElementById('summary-scroll').scrollWidth")
        scroller.evaluate("(el) => { el.scrollLeft = el.scrollWidth; }")
        assert page.evaluate("document.getElementById('summary-scroll').scrollLeft") > 0, width
        after = page.evaluate(IDENTITY)
        assert after == before  # sticky: the cell, status, TP, users and offload stay in place
        # A column set hidden is gone from every row; shown again, it is back.
        hit = "table.summary th.c-cache"
        assert page.locator(hit).first.is_visible()
        page.uncheck("#set-cache")
        assert page.locator(hit).count() > 0 and not page.locator(hit).first.is_visible()
        assert page.locator("table.summary td.c-cache").first.is_hidden()
        page.check("#set-cache")
        assert page.locator(hit).first.is_visible()
        # Health starts hidden; the main Pareto figure shows, the other panels one at a time.
        assert not page.locator("table.summary th.c-health").first.is_visible()
        shown = page.eval_on_selector_all(".panes figure", "fs => fs.map(f => f.offsetParent !== null)")
        assert shown == [True, False, False]
        page.check("#pane-total_tok_per_s_per_gpu")
        shown = page.eval_on_selector_all(".panes figure", "fs => fs.map(f => f.offsetParent !== null)")
        assert shown == [False, True, False]
        assert errors == [] and network == []
