"""Each run's headline, as the dashboard opens with it: the same ``collect.headline`` the report and
summary.md print, fed from the store instead of a collected folder.

The store holds what collect's tables hold for the headline: every point's scope, position and
figures; a capacity cell's cell and capacity.json (its search's tiers); and, per ordinary point, its
SLO statistics against the default tiers, measured at ingest by the same function collect's grid
uses (``result_files.PointFacts.slo_run``). So a run's tiers are its capacity cells' searches and its
series read as grids against the default tiers (a run collected with ``--slo`` reads its own tiers
in its report; the dashboard keeps to the defaults).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
from kv_cache_tester.metrics import finite
from pydantic import ValidationError

from agentsweep.capacity.grid import GridRun
from agentsweep.collect.capacity import (
    CAPACITY_COLUMNS,
    CapacityCell,
    config_facts,
    grid_rows,
    search_rows,
)
from agentsweep.collect.headline import INTERACTIVITY_TEXT, OUTPUT, OUTPUT_RANGE, Headline, headline
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import CapacityRecord
from agentsweep.contract.slo import DEFAULT_TIERS, SloConstraint
from agentsweep.store.query import Point

STEP_NOTE = "step of capacity cell "
# The figures of a point the headline reads (besides its scope and position).
HEADLINE_METRICS = (
    "interactivity_p50_tok_per_s",
    "output_tok_per_s_per_gpu",
    "total_tok_per_s_per_gpu",
    "avg_power_w",
)


def _step_of(point: Point) -> str:
    first = point.notes.split("; ")[0] if point.notes else ""
    return first.removeprefix(STEP_NOTE) if first.startswith(STEP_NOTE) else ""


def _row(point: Point) -> dict[str, Any]:
    """A point as a row of collect's summary table (the columns the headline reads)."""
    return {
        "exp_name": point.exp_name,
        "status": point.status,
        "reason": point.reason,
        "config_key": point.config_key,
        "model": point.scope["model"],
        "hardware": point.scope["hardware"],
        "engine": point.scope["engine"],
        "precision": point.scope["precision"],
        "offload": point.scope["offload"],
        "router": point.scope["router"],
        "disagg": point.labels.get("disagg", ""),
        "tp": point.position["tp"],
        "users": point.position["users"],
        "gpus": point.position["gpus"],
        "step_of": _step_of(point),
        "capacity": "capacity" if point.capacity else "",
        "_point": point,
        OUTPUT_RANGE: point.noise.get(OUTPUT),
        **{name: point.metrics.get(name) for name in HEADLINE_METRICS},
    }


def _stored_run(
    member: Mapping[str, Any], constraints: Sequence[SloConstraint]
) -> tuple[int, GridRun] | None:
    """A grid member from what ingest stored (None for a point stored before it did)."""
    point: Point = member["_point"]
    stored = point.slo_run
    statistics = stored.get("statistics")
    if not isinstance(statistics, dict) or any(c.key not in statistics for c in constraints):
        return None
    kv_set, kv_pool = finite(stored.get("kv_working_set")), finite(stored.get("kv_pool"))
    return max(1, point.position["gpus"]), GridRun(
        users=point.position["users"],
        status=point.status,
        statistics={c.key: finite(statistics.get(c.key)) for c in constraints},
        reasons=(point.reason,) if point.reason else (),
        output_tok_per_s_per_gpu=finite(stored.get("output")),
        total_tok_per_s_per_gpu=finite(stored.get("total")),
        kv_working_set_tokens=int(kv_set) if kv_set is not None else None,
        kv_pool_tokens=int(kv_pool) if kv_pool is not None else None,
    )


def run_headline(points: Sequence[Point], capacity: Mapping[int, dict[str, Any]]) -> Headline:
    """One run's headline from its points; ``capacity``: capacity.json by capacity cell's point id."""
    rows = [_row(p) for p in points]
    df = pd.DataFrame.from_records(rows) if rows else pd.DataFrame()
    cells = []
    for row in rows:
        point: Point = row["_point"]
        found = capacity.get(point.id)
        if point.capacity_cell is None or found is None or point.status in ("MALFORMED", "MISSING"):
            continue
        try:
            cell = Cell.model_validate(point.capacity_cell)
            record = CapacityRecord.model_validate(found)
        except (ValidationError, ValueError):
            continue  # ingest checked both; a store changed since reads as no search
        cells.append(CapacityCell(point.exp_name, cell, record, Path(), config_facts(row)))
    grid, _lines = grid_rows(df, DEFAULT_TIERS, _stored_run)
    table = pd.DataFrame.from_records([*search_rows(cells), *grid], columns=list(CAPACITY_COLUMNS))
    return headline(df.drop(columns=["_point"]) if not df.empty else df, table)


def headline_json(head: Headline) -> dict[str, Any]:
    """The headline as the dashboard's index carries it (app.js renders it as text, escaped)."""
    groups = []
    for group in head.groups:
        groups.append(
            {
                "title": group.title,
                "verdicts": group.verdicts,
                "note": group.note,
                "tiers": [{**asdict(t), "agents": t.agents, "per_mw": t.per_mw} for t in group.tiers],
                "levels": [{**asdict(level), "level_text": level.level_text} for level in group.levels],
            }
        )
    return {"groups": groups, "interactivity": INTERACTIVITY_TEXT}


def headlines(points: Sequence[Point], capacity: Mapping[int, dict[str, Any]]) -> dict[str, Any]:
    """Every run's headline, by run id (as text: JSON object keys)."""
    by_run: dict[int, list[Point]] = {}
    for point in points:
        by_run.setdefault(point.run.id, []).append(point)
    return {str(run): headline_json(run_headline(members, capacity)) for run, members in by_run.items()}
