"""Routed cells on the frontiers, the plots and the report: a series per offload × router × shape."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.collect.aggregate import build_rows, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.collect.pareto import frontier_table, successful
from agentsweep.collect.plots import OFFLOAD_COLORS, OFFLOAD_NAMES, _legend_handles, _styles
from agentsweep.collect.report import TABLE, summary_markdown

from .conftest import Spec, write_cell
from .routed_cells import pd_cell, routed_cell

USERS = (2, 8, 32)


def _single(root: Path) -> None:
    for users in USERS:
        for offload in ("on", "off"):
            write_cell(root, Spec(users=users, offload=offload))


def _mixed(root: Path) -> None:
    _single(root)
    for users in USERS:
        spec = Spec(users=users, offload="off")
        routed_cell(root, spec, router="round_robin", hits=(0.4, 0.45))
        routed_cell(root, spec, router="cache_aware", hits=(0.7, 0.75))
        routed_cell(root, Spec(users=users, offload="on"), router="cache_aware", hits=(0.7, 0.8))
        pd_cell(root, spec, prefill=(1, 1), decode_hits=(0.3, 0.35), router="round_robin")


def _frame(root: Path) -> pd.DataFrame:
    return to_frame(build_rows(find_cells(root)))


def test_each_offload_router_shape_combination_is_its_own_series(tmp_path):
    _mixed(tmp_path)
    frame = _frame(tmp_path)
    assert set(frame["status"]) == {"SUCCESS"}
    front = frontier_table(frame)
    series = set(front[front["series_kind"] == "engine_offload"]["series"])
    assert series == {
        "sim offload=on",
        "sim offload=off",
        "sim offload=off router=round_robin",
        "sim offload=off router=cache_aware",
        "sim offload=on router=cache_aware",
        "sim offload=off router=round_robin disagg=p1x1-d2x1",
    }
    # Every series' frontier holds only its own cells.
    for label, group in front[front["series_kind"] == "engine_offload"].groupby("series"):
        cells = frame[frame["exp_name"].isin(group["exp_name"])]
        combos = zip(cells["offload"], cells["router"].fillna(""), cells["disagg"].fillna(""), strict=True)
        assert len(set(combos)) == 1, label
    pd_rows = front[front["disagg"] == "p1x1-d2x1"]
    assert not pd_rows.empty and set(pd_rows["router"]) == {"round_robin"}


def test_each_combination_gets_its_own_legend_entry_and_colour(tmp_path):
    _mixed(tmp_path)
    ok = successful(_frame(tmp_path))
    markers, styles = _styles(ok)
    handles = [h for h in _legend_handles(ok, markers, styles) if h.get_linestyle() == "-"]
    labels = [h.get_label() for h in handles]
    assert labels == [
        OFFLOAD_NAMES["on"],
        OFFLOAD_NAMES["off"],
        "offload on · router cache_aware",
        "offload off · router cache_aware",
        "offload off · router round_robin",
        "offload off · router round_robin · p1x1-d2x1",
    ]
    colours = [h.get_color() for h in handles]
    assert len(set(colours)) == len(colours)
    assert colours[:2] == [OFFLOAD_COLORS["on"], OFFLOAD_COLORS["off"]]  # single engines keep theirs


def test_a_single_engine_sweep_keeps_its_series_legend_and_table(tmp_path):
    _single(tmp_path)
    frame = _frame(tmp_path)
    front = frontier_table(frame)
    assert set(front[front["series_kind"] == "engine_offload"]["series"]) == {
        "sim offload=on",
        "sim offload=off",
    }
    ok = successful(frame)
    markers, styles = _styles(ok)
    handles = [h for h in _legend_handles(ok, markers, styles) if h.get_linestyle() == "-"]
    assert [(h.get_label(), h.get_color()) for h in handles] == [
        (OFFLOAD_NAMES[o], OFFLOAD_COLORS[o]) for o in ("on", "off")
    ]
    header = next(line for line in summary_markdown(frame, front).splitlines() if line.startswith("| Cell |"))
    assert header == "| " + " | ".join(h for _c, h, _k in TABLE) + " |"


def _header(markdown: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith("| Cell |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.slow
@pytest.mark.parametrize("with_pd", [False, True])
def test_the_report_shows_routed_columns_when_a_cell_is_routed(tmp_path, with_pd):
    _single(tmp_path / "art")
    spec = Spec(users=8, offload="off")
    routed_cell(tmp_path / "art", spec, router="cache_aware", hits=(0.5, 0.7), counts=(30.0, 10.0))
    if with_pd:
        pd_cell(tmp_path / "art", spec, prefill=(1, 1), decode_hits=(0.3, 0.35))
    assert main(["collect", str(tmp_path / "art"), str(tmp_path / "out"), "--no-plots"]) == 0
    markdown = (tmp_path / "out" / "summary.md").read_text()
    headers = _header(markdown)
    for header in (
        "Replicas",
        "Router",
        "Busiest inst.",
        "Affinity",
        "Inst. GPU hit min",
        "Inst. GPU hit max",
    ):
        assert header in headers
    assert ("Disagg." in headers) is with_pd and ("Prefill GPU hit" in headers) is with_pd
    assert "Nodes" not in headers  # every cell on one node
    row = next(line for line in markdown.splitlines() if "-r2-cache_aware" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    shown = dict(zip(headers, cells, strict=True))
    assert (shown["Replicas"], shown["Router"], shown["Busiest inst."]) == ("2", "cache_aware", "75.0%")
    assert (shown["Inst. GPU hit min"], shown["Inst. GPU hit max"]) == ("50.0%", "70.0%")
    single = next(line for line in markdown.splitlines() if "-u8-on |" in line)
    assert dict(zip(headers, [c.strip() for c in single.strip("|").split("|")], strict=True))["Router"] == "–"
    html = (tmp_path / "out" / "report.html").read_text()
    assert '<th class="c-routing">Busiest inst.</th>' in html and '<th class="c-routing">Router</th>' in html
    assert ('<th class="c-routing">Prefill GPU hit</th>' in html) is with_pd


@pytest.mark.slow
def test_routed_cells_with_router_scrapes_get_the_routing_figure(tmp_path):
    from agentsweep.collect.plots import routing_figure, write_plots

    root = tmp_path / "sweep"
    _single(root)
    out = tmp_path / "out"
    out.mkdir()
    assert routing_figure(_frame(root), out / "routing.png") is None  # no routed cell
    cell = routed_cell(root, Spec(users=8, offload="off"), router="round_robin", hits=(0.4, 0.45))
    frame = _frame(root)
    assert routing_figure(frame, out / "routing.png") is None  # routed, but no router_metrics.csv
    (cell / "router_metrics.csv").write_text("time_s,requests.r0\nnot,a number\n")
    assert routing_figure(frame, out / "routing.png") is None  # unusable scrapes draw nothing
    rows = "".join(f"{1000 + t},{3 * t},{3 * t}\n" for t in range(10))
    (cell / "router_metrics.csv").write_text("time_s,requests.r0,requests.r1\n" + rows)
    titles = [title for title, _ in write_plots(frame, out)]
    assert titles[-1] == "Requests per engine instance over the run (routed cells)"
    assert (out / "routing.png").stat().st_size > 10_000
