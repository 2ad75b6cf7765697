"""The headline (collect.headline): per hardware and model, the best configuration per SLO tier and the
frontier's throughput per GPU at 20 / 50 / 100 tok/s per user, and the report's first screen in
headless Chromium."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.collect.headline import INTERACTIVITY, OUTPUT, OUTPUT_RANGE, TOTAL, from_files, headline

from tests.dashboard.browser import offline_page


def _point(name: str, x: float, y: float, **extra: object) -> dict[str, object]:
    row: dict[str, object] = {
        "exp_name": name, "status": "SUCCESS", "model": "m", "runner": "h200", "engine": "sim",
        "tp": 1, "users": 4, "offload": "on", "router": "", "disagg": "", "replicas": 1,
        "step_of": "", "capacity": "", INTERACTIVITY: x, OUTPUT: y, TOTAL: 10 * y,
    }  # fmt: skip
    row.update(extra)
    return row


def _tier_row(**values: object) -> dict[str, object]:
    row: dict[str, object] = {
        "source": "grid", "cell": "c", "tier": "interactive", "description": "interactive (TTFT p90 ≤ 10 s)",
        "boundary_users": 0, "agents_per_gpu": 0.0, "interval_low": None, "interval_high": None,
        "interval_kind": "grid", "boundary_type": "none", "binding": "TTFT p90", "binding_value": 12.0,
        "binding_users": 2, "output_tok_per_s_per_gpu": None, "total_tok_per_s_per_gpu": None,
        "agents_per_mw": None, "gpus": 1, "stop_reason": "", "steps": 3, "engine_s": None, "line": "",
        "binding_text": "12 s", "repeats": 1, "config_key": "k", "model": "m", "hardware": "h200",
        "engine": "sim", "tp": 1, "offload": "on", "router": "", "disagg": "", "replicas": 1,
    }  # fmt: skip
    row.update(values)
    return row


# Frontier of (interactivity, output tok/s/GPU): a (10, 300), b (30, 200), c (60, 100); d lies under it.
POINTS = [
    _point("a", 10.0, 300.0, tp=2, users=16),
    _point("b", 30.0, 200.0, tp=1, users=8),
    _point("c", 60.0, 100.0, tp=1, users=2, offload="off"),
    _point("d", 25.0, 150.0, tp=1, users=4, offload="noprefix"),
]


def test_throughput_at_each_level_is_read_off_the_frontier_interpolated_and_never_extrapolated() -> None:
    head = headline(pd.DataFrame(POINTS), None)
    (group,) = head.groups
    at = {p.level: p for p in group.levels}
    # 20 lies between a (10) and b (30): linear between their throughputs, and said so.
    share = (20 - 10) / (30 - 10)
    assert at[20].kind == "interpolated"
    assert math.isclose(at[20].output, 300 + share * (200 - 300))
    assert math.isclose(at[20].total, 10 * (300 + share * (200 - 300)))
    assert "TP 2 · 16 users · offload on" in at[20].configuration
    assert "TP 1 · 8 users · offload on" in at[20].configuration
    assert "interpolated between 10.0 and 30.0 tok/s/user" in at[20].how
    share = (50 - 30) / (60 - 30)
    assert at[50].kind == "interpolated" and math.isclose(at[50].output, 200 + share * (100 - 200))
    # Past the fastest point nothing is made up.
    assert at[100].kind == "not reached" and at[100].output is None
    assert "fastest point gives 60.0 tok/s/user" in at[100].how
    # A point right at a level is that point; a level below every point takes the slowest point.
    exact = headline(pd.DataFrame([*POINTS, _point("e", 50.0, 150.0, users=3)]), None)
    assert [(p.kind, p.output) for p in exact.groups[0].levels][1] == ("measured", 150.0)
    faster = headline(pd.DataFrame(POINTS[1:]), None).groups[0].levels[0]
    assert (faster.kind, faster.output) == ("faster", 200.0)
    assert "every frontier point is faster" in faster.how
    # INVALID points and a capacity cell's own row are no points; its SUCCESS steps are.
    others = [
        _point("f", 70.0, 500.0, status="INVALID"),
        _point("g", 80.0, 900.0, capacity='{"low":1}'),
        _point("h", 20.0, 400.0, step_of="g"),
    ]
    with_steps = headline(pd.DataFrame([*POINTS, *others]), None).groups[0]
    assert with_steps.levels[0].output == 400.0 and with_steps.levels[2].kind == "not reached"
    assert "(capacity step)" in with_steps.levels[0].configuration
    assert with_steps.cells == (("SUCCESS", 5), ("INVALID", 1))
    assert with_steps.steps == (("SUCCESS", 1),)
    assert with_steps.verdicts == "6 cell(s): 5 SUCCESS, 1 INVALID; and 1 capacity step(s): 1 SUCCESS"


def test_a_levels_noise_range_is_read_off_the_frontier_as_its_figure_is() -> None:
    ranged = [
        {**POINTS[0], OUTPUT_RANGE: (280.0, 320.0)},
        {**POINTS[1], OUTPUT_RANGE: (190.0, 210.0)},
        POINTS[2],  # no range: a level read from it has none
        POINTS[3],
    ]
    at = {p.level: p for p in headline(pd.DataFrame(ranged), None).groups[0].levels}
    share = (20 - 10) / (30 - 10)
    assert at[20].output_range is not None
    low, high = at[20].output_range
    assert math.isclose(low, 280 + share * (190 - 280)) and math.isclose(high, 320 + share * (210 - 320))
    assert low < at[20].output < high
    assert at[50].output_range is None  # between b (a range) and c (none)
    faster = headline(pd.DataFrame(ranged[1:]), None).groups[0].levels[0]
    assert (faster.kind, faster.output_range) == ("faster", (190.0, 210.0))
    # Rows without the column (collect's summary.csv) read as no range.
    assert all(p.output_range is None for p in headline(pd.DataFrame(POINTS), None).groups[0].levels)


def test_each_tier_names_its_best_configuration_or_says_none_meets_it() -> None:
    capacity = pd.DataFrame(
        [
            _tier_row(
                boundary_users=4,
                agents_per_gpu=2.0,
                boundary_type="at_least",
                tp=2,
                gpus=2,
                binding="",
                binding_users=None,
                binding_text="",
            ),
            _tier_row(
                source="search",
                boundary_users=6,
                agents_per_gpu=6.0,
                boundary_type="smooth",
                interval_low=6,
                interval_high=6,
                interval_kind="resolution",
                agents_per_mw=9000.0,
                binding="speed p25",
                binding_users=7,
                binding_text="18 tok/s",
                offload="off",
            ),
            _tier_row(tier="fast", description="fast (TTFT p90 ≤ 2 s)", binding_users=2),
            _tier_row(tier="fast", description="fast (TTFT p90 ≤ 2 s)", binding="speed p25", binding_users=1),
            _tier_row(tier="fast", description="fast (TTFT p90 ≤ 2 s)", binding_users=2, hardware="b200"),
        ]
    )
    head = headline(pd.DataFrame(POINTS), capacity)
    interactive, fast = head.groups[0].tiers
    assert (interactive.met, interactive.agents, interactive.per_mw) == (True, "6", "9,000")
    assert interactive.configuration == "TP 1 · offload off"
    assert interactive.binding == "speed p25 (18 tok/s at 7 users)"
    # One run per count is said, so a bracket of 6-6 never reads as a measured interval.
    assert interactive.reading == (
        "capacity search: passes at 6 users, fails at 7; one run per count, so no run-to-run spread"
    )
    assert not fast.met and fast.agents == "–"
    assert fast.binding == (
        "2 configuration(s) read, none meets it at the lowest count measured (1, 2 users); "
        "bound by TTFT p90 in 1 of 2"
    )
    lines = head.lines()
    assert lines[0] == "h200 · m: 4 cell(s): 4 SUCCESS"
    assert lines[1].startswith(
        "  tier interactive (TTFT p90 ≤ 10 s): 6 agents per GPU, 9,000 per MW with TP 1"
    )
    assert lines[2].startswith("  tier fast (TTFT p90 ≤ 2 s): no configuration meets it")
    # The largest count measured meeting it reads "at least".
    only_grid = headline(pd.DataFrame(POINTS), capacity.iloc[[0]]).groups[0].tiers[0]
    assert (only_grid.agents, only_grid.at_least) == ("≥ 2", True)
    assert only_grid.reading.startswith("grid: the largest count measured (4 users) meets it")
    # A group without any capacity row says why it has no tier.
    assert "no SLO tier read" in headline(pd.DataFrame(POINTS), None).groups[0].note


def test_one_group_per_hardware_and_model_and_the_same_headline_from_the_files(tmp_path: Path) -> None:
    rows = [*POINTS, _point("x", 40.0, 700.0, runner="b200"), _point("y", 40.0, 50.0, model="other")]
    capacity = pd.DataFrame([_tier_row(boundary_users=3, agents_per_gpu=3.0, boundary_type="exact",
                                       interval_low=3, interval_high=3, hardware="b200")])  # fmt: skip
    head = headline(pd.DataFrame(rows), capacity)
    assert [g.title for g in head.groups] == ["h200 · m", "b200 · m", "h200 · other"]
    assert [len(g.tiers) for g in head.groups] == [0, 1, 0]
    assert head.groups[1].levels[0].output == 700.0  # b200's own frontier, not h200's
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    capacity.to_csv(tmp_path / "capacity.csv", index=False)
    assert from_files(tmp_path) == head
    assert from_files(tmp_path / "nothing") is None


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.collect.conftest import GRID, write_cell

    root = tmp_path_factory.mktemp("sweep") / "artifacts"
    for spec in GRID:
        write_cell(root, spec)
    out = root.parent / "aggregated"
    assert main(["collect", str(root), str(out), "--no-plots"]) == 0  # its tables are what is read
    return out


@pytest.mark.slow
def test_summary_md_and_the_step_summary_open_with_the_headline(
    collected: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    md = (collected / "summary.md").read_text()
    head = from_files(collected)
    assert head is not None and len(head.groups) == 1
    (group,) = head.groups
    assert [t.tier for t in group.tiers] == ["interactive", "fast", "realtime"]
    headline_part = md.split("### Sweep")[0]
    assert f"### {group.title}" in headline_part and group.verdicts in headline_part
    for tier in group.tiers:
        assert f"| {tier.description} | " in headline_part
    for level in group.levels:
        assert f"| {level.level_text} | " in headline_part
    step_summary = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    assert main(["collect", str(collected.parent / "artifacts"), str(tmp_path / "again"), "--no-plots"]) == 0
    assert step_summary.read_text().startswith(md.split("### Sweep")[0])


@pytest.mark.slow
@pytest.mark.chromium
def test_the_reports_first_screen_answers_per_tier(collected: Path) -> None:
    head = from_files(collected)
    assert head is not None
    with offline_page((1366, 768)) as (page, errors, network):
        page.goto((collected / "report.html").as_uri())
        rows = page.eval_on_selector_all(
            "#headline table.answer tr:not(:first-child)",
            "rows => rows.map(r => [r.cells[0].textContent, r.getBoundingClientRect().bottom])",
        )
        assert errors == [] and network == []
    tiers = [t.description for g in head.groups for t in g.tiers]
    levels = [p.level_text for g in head.groups for p in g.levels]
    assert [text for text, _bottom in rows] == tiers + levels
    # Every tier's and every level's row lies on the first screen (1,366 x 768), nothing scrolled.
    assert all(bottom <= 768 for _text, bottom in rows), rows
