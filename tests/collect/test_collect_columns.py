"""summary.csv's declared metric columns: sources, units and the engine-clock rescale."""

from __future__ import annotations

import json
import typing
from typing import Any

import pandas as pd
import pytest
from agentsweep.collect.aggregate import METRIC_COLUMNS, build_rows, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.collect.stream import RequestStats
from agentsweep.collect.window import SERVER_COLUMNS
from agentsweep.contract import columns
from agentsweep.contract.columns import Unit
from kv_cache_tester.replay import Summary


def _declared(td: Any, path: str) -> bool:
    """Whether a dotted path names a field of TypedDict ``td`` (a last key may hold a dot)."""
    hints = typing.get_type_hints(td)
    if path in hints:
        return True
    head, _, rest = path.partition(".")
    sub = next(
        (t for t in typing.get_args(hints.get(head)) or (hints.get(head),) if typing.is_typeddict(t)), None
    )
    return bool(rest) and sub is not None and _declared(sub, rest)


def test_every_summary_column_reads_a_declared_summary_field():
    for column in columns.SUMMARY:
        assert column.source is not None and _declared(Summary, column.source), column
    assert not _declared(Summary, "latency.ttft_s.p42")  # the check can fail


def test_declared_columns_match_what_is_computed():
    assert list(RequestStats().as_columns()) == [c.name for c in columns.REQUESTS]
    assert tuple(c.name for c in columns.SERVER) == SERVER_COLUMNS
    assert len(set(METRIC_COLUMNS)) == len(METRIC_COLUMNS)


def test_engine_clock_rescales_by_unit_and_leaves_wall_time(tmp_path, cell_factory, spec_cls):
    cell_factory(tmp_path / "wall", spec_cls(tp=2, users=8, offload="on"))
    cell_factory(tmp_path / "fast", spec_cls(tp=2, users=8, offload="on", speed=20.0))
    a = to_frame(build_rows(find_cells(tmp_path / "wall"))).iloc[0]
    b = to_frame(build_rows(find_cells(tmp_path / "fast"))).iloc[0]
    for column in columns.METRICS:
        if column.unit in (Unit.FACTOR, Unit.JSON, Unit.LABEL) or pd.isna(a[column.name]):
            continue
        factor = {Unit.SECONDS: 20.0}.get(
            column.unit, 1 / 20.0 if column.unit in columns.ENGINE_CLOCK else 1.0
        )
        assert b[column.name] == pytest.approx(a[column.name] * factor, rel=1e-12), column
    for name in ("window_s", "dispatch_lag_p99_s", "server_max_gap_s"):  # wall time: never rescaled
        assert b[name] == a[name] and not pd.isna(a[name])


def test_a_mistyped_summary_field_makes_the_cell_malformed(tmp_path, cell_factory, spec_cls):
    path = cell_factory(tmp_path / "art", spec_cls())
    summary = json.loads((path / "summary.json").read_text())
    summary["latency"]["tpot_s"]["p99"] = "12 ms"
    (path / "summary.json").write_text(json.dumps(summary))
    row = to_frame(build_rows(find_cells(tmp_path / "art"))).iloc[0]
    assert row["status"] == "MALFORMED"
    assert row["reason"] == "summary.json: latency.tpot_s.p99: must be a number or null, got '12 ms'"
