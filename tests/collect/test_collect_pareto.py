"""Frontier properties (hypothesis) and a hand-checked example."""

from __future__ import annotations

import math

import pandas as pd
from agentsweep.collect.pareto import dominates, frontier, frontier_table
from hypothesis import given, settings
from hypothesis import strategies as st

coords = st.one_of(
    st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    st.sampled_from([1.0, 2.0, 3.0]),  # force ties
)
points = st.lists(st.tuples(coords, coords), min_size=0, max_size=40)
with_nan = st.lists(
    st.tuples(st.one_of(coords, st.just(math.nan)), st.one_of(coords, st.just(math.inf))),
    max_size=20,
)


@settings(max_examples=300, deadline=None)
@given(points, st.booleans())
def test_no_frontier_point_is_dominated(pts, minimize_x):
    front = frontier(pts, minimize_x)
    for i in front:
        assert not any(dominates(pts[j], pts[i], minimize_x) for j in range(len(pts)))


@settings(max_examples=300, deadline=None)
@given(points, st.booleans())
def test_every_point_off_the_frontier_is_dominated_by_a_frontier_point(pts, minimize_x):
    front = set(frontier(pts, minimize_x))
    for i in set(range(len(pts))) - front:
        assert any(dominates(pts[j], pts[i], minimize_x) for j in front)


@settings(max_examples=100, deadline=None)
@given(with_nan, st.booleans())
def test_non_finite_points_never_on_the_frontier(pts, minimize_x):
    for i in frontier(pts, minimize_x):
        assert all(math.isfinite(v) for v in pts[i])


def test_hand_example_latency_and_interactivity():
    # (latency, throughput): b is dominated by a; d is dominated by c.
    pts = [(1.0, 10.0), (2.0, 9.0), (3.0, 30.0), (4.0, 25.0), (0.5, 5.0)]
    assert frontier(pts, minimize_x=True) == [4, 0, 2]
    # interactivity: higher x is better; only (4, 25) and (3, 30) are not beaten.
    assert frontier(pts, minimize_x=False) == [2, 3]


def test_frontier_table_per_series_and_pooled():
    df = pd.DataFrame(
        {
            "exp_name": ["a", "b", "c", "d", "e"],
            "status": ["SUCCESS", "SUCCESS", "SUCCESS", "SUCCESS", "FAILED"],
            "engine": ["vllm"] * 5,
            "offload": ["on", "on", "off", "off", "on"],
            "tp": [1, 2, 1, 1, 1],
            "users": [4, 8, 4, 8, 16],
            "ttft_p50_s": [1.0, 2.0, 1.5, 0.8, 0.1],
            "output_tok_per_s_per_gpu": [100.0, 150.0, 90.0, 95.0, 999.0],
        }
    )
    table = frontier_table(df)
    sub = table[(table.x_metric == "ttft_p50_s") & (table.y_metric == "output_tok_per_s_per_gpu")]
    by_series = {s: sorted(g.exp_name) for s, g in sub.groupby("series")}
    assert by_series["vllm offload=on"] == ["a", "b"]
    assert by_series["vllm offload=off"] == ["d"]  # c is slower and lower than d
    assert by_series["vllm offload=on tp=1"] == ["a"]
    assert by_series["all cells"] == ["a", "b", "d"]  # e FAILED: never on a frontier


def test_e2e_normalised_interactivity_at_p90_is_an_axis_higher_is_better():
    df = pd.DataFrame(
        {
            "exp_name": ["a", "b", "c"],
            "status": ["SUCCESS"] * 3,
            "engine": ["vllm"] * 3,
            "offload": ["off"] * 3,
            "tp": [1, 1, 1],
            "users": [2, 4, 8],
            "e2e_norm_interactivity_p90_tok_per_s": [30.0, 20.0, 25.0],
            "output_tok_per_s_per_gpu": [100.0, 150.0, 120.0],
        }
    )
    table = frontier_table(df)
    sub = table[
        (table.x_metric == "e2e_norm_interactivity_p90_tok_per_s")
        & (table.y_metric == "output_tok_per_s_per_gpu")
        & (table.series == "all cells")
    ]
    assert sorted(sub.exp_name) == ["a", "b", "c"]  # none is both faster per user and higher per GPU
    df.loc[2, "e2e_norm_interactivity_p90_tok_per_s"] = 19.0  # c: slower than b and lower: dominated
    table = frontier_table(df)
    sub = table[(table.x_metric == "e2e_norm_interactivity_p90_tok_per_s") & (table.series == "all cells")]
    assert sorted(sub[sub.y_metric == "output_tok_per_s_per_gpu"].exp_name) == ["a", "b"]
