"""The capacity table (capacity.csv: tier × cell) and its plain lines, from the collected rows.

Two sources, each row marked with it:

- ``search``: a capacity cell's capacity.json, as the cell wrote it (per tier its boundary, interval,
  binding constraint, boundary type and stop reason);
- ``grid``: an ordinary sweep's cells, per series (config key, engine, offload, router, shape, TP),
  read off the grid of user counts by ``agentsweep.capacity.grid`` (interpolated between the cells
  that bracket a boundary, and marked so). The tiers are ``--slo`` when given, else the tiers of the
  sweep's capacity cells, else the default tiers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from agentsweep.capacity.grid import GridRun, grid_capacity
from agentsweep.capacity.measure import run_figures
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import CapacityRecord, read_capacity, read_cell_record
from agentsweep.contract.slo import DEFAULT_TIERS, SloTier, distinct_constraints
from agentsweep.errors import InputError

CAPACITY_COLUMNS = (
    "source",
    "cell",
    "tier",
    "description",
    "boundary_users",
    "agents_per_gpu",
    "interval_low",
    "interval_high",
    "interval_kind",
    "boundary_type",
    "binding",
    "binding_value",
    "binding_users",
    "output_tok_per_s_per_gpu",
    "total_tok_per_s_per_gpu",
    "agents_per_mw",
    "gpus",
    "stop_reason",
    "steps",
    "engine_s",
    "line",
)
GRID_KEYS = ("config_key", "engine", "offload", "router", "disagg", "tp")


@dataclass
class CapacityCell:
    """A capacity cell as collected: its cell and capacity.json (for the table, lines and plots)."""

    exp_name: str
    cell: Cell
    record: CapacityRecord
    result_dir: Path


@dataclass
class CapacityResults:
    table: pd.DataFrame
    lines: list[str] = field(default_factory=list)
    cells: list[CapacityCell] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _is_capacity_row(row: dict[str, Any]) -> bool:
    return bool(_text(row.get("capacity")))


def capacity_cells(df: pd.DataFrame, notes: list[str]) -> list[CapacityCell]:
    """Every capacity cell of the table that left a readable capacity.json."""
    out: list[CapacityCell] = []
    for row in df.to_dict("records"):
        if not _is_capacity_row(row) or row.get("status") in ("MALFORMED", "MISSING"):
            continue
        path = Path(str(row["result_dir"]))
        try:
            record = read_capacity(path)
            cell_record = read_cell_record(path)
            cell = cell_record.parse_cell() if cell_record is not None else None
        except InputError as err:
            notes.append(f"{row['exp_name']}: {err}")
            continue
        if record is None or cell is None or cell.capacity is None:
            continue
        out.append(CapacityCell(str(row["exp_name"]), cell, record, path))
    return out


def _search_rows(cells: Sequence[CapacityCell]) -> list[dict[str, Any]]:
    rows = []
    for item in cells:
        for tier in item.record.tiers:
            low, high = tier.interval_users if tier.interval_users is not None else (None, None)
            rows.append(
                {
                    "source": "search",
                    "cell": item.exp_name,
                    "tier": tier.tier,
                    "description": tier.description,
                    "boundary_users": tier.boundary_users,
                    "agents_per_gpu": tier.agents_per_gpu,
                    "interval_low": low,
                    "interval_high": high,
                    "interval_kind": tier.interval_kind,
                    "boundary_type": tier.boundary_type,
                    "binding": tier.binding,
                    "binding_value": tier.binding_value,
                    "binding_users": tier.binding_users,
                    "output_tok_per_s_per_gpu": tier.output_tok_per_s_per_gpu,
                    "total_tok_per_s_per_gpu": tier.total_tok_per_s_per_gpu,
                    "agents_per_mw": tier.agents_per_mw,
                    "gpus": item.record.gpus,
                    "stop_reason": tier.stop_reason,
                    "steps": len(item.record.steps),
                    "engine_s": item.record.engine_s,
                    "line": tier.line,
                }
            )
    return rows


def grid_tiers(override: Sequence[SloTier] | None, cells: Sequence[CapacityCell]) -> tuple[SloTier, ...]:
    """The tiers a grid is read against: ``--slo``, else the capacity cells', else the defaults."""
    if override:
        return tuple(override)
    for item in cells:
        assert item.cell.capacity is not None
        return item.cell.capacity.tiers
    return DEFAULT_TIERS


def _series_label(key: dict[str, Any], several_keys: bool) -> str:
    label = f"{key['engine']} offload={key['offload']}"
    for part in ("router", "disagg"):
        if _text(key.get(part)):
            label += f" {part}={key[part]}"
    tp = key.get("tp")
    label += f" tp={int(tp) if isinstance(tp, float) and tp.is_integer() else tp}"
    return f"{key['config_key']} {label}" if several_keys else label


def _grid_rows(
    df: pd.DataFrame, tiers: Sequence[SloTier], notes: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    if df.empty or "status" not in df.columns:
        return [], []
    records = [
        r
        for r in df.to_dict("records")
        if r.get("status") in ("SUCCESS", "INVALID")
        and not _is_capacity_row(r)
        and not _text(r.get("step_of"))
    ]
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(tuple(_text(r.get(k)) for k in GRID_KEYS), []).append(r)
    several_keys = len({k[0] for k in groups}) > 1
    constraints = distinct_constraints(tuple(tiers))
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for key, members in groups.items():
        if len({m.get("users") for m in members}) < 2:
            continue  # one user count is a point, not a grid
        runs: list[GridRun] = []
        gpus = 1
        for member in members:
            path = Path(str(member["result_dir"]))
            try:
                cell_record = read_cell_record(path)
                cell = cell_record.parse_cell() if cell_record is not None else None
            except InputError as err:
                notes.append(f"{member['exp_name']}: {err}")
                continue
            if cell is None:
                continue
            gpus = cell.gpus
            figures = run_figures(path, cell, constraints)
            runs.append(
                GridRun(
                    users=cell.users,
                    status=str(member["status"]),
                    statistics=figures.statistics,
                    reasons=(str(member.get("reason") or ""),) if member.get("reason") else (),
                    output_tok_per_s_per_gpu=figures.output_tok_per_s_per_gpu,
                    total_tok_per_s_per_gpu=figures.total_tok_per_s_per_gpu,
                    kv_working_set_tokens=figures.kv_working_set_tokens,
                    kv_pool_tokens=figures.kv_pool_tokens,
                )
            )
        label = _series_label(dict(zip(GRID_KEYS, key, strict=True)), several_keys)
        for tier in tiers:
            found = grid_capacity(tier, runs)
            if found is None:
                continue
            line = found.line(label, gpus)
            lines.append(line)
            rows.append(
                {
                    "source": "grid",
                    "cell": label,
                    "tier": tier.name,
                    "description": tier.describe(),
                    "boundary_users": found.boundary_users,
                    "agents_per_gpu": found.boundary_users / gpus,
                    "interval_low": found.passing if found.kind not in ("none", "at_least") else None,
                    "interval_high": found.failing - 1
                    if found.failing is not None and found.passing
                    else None,
                    "interval_kind": "grid",
                    "boundary_type": found.kind,
                    "binding": found.binding,
                    "binding_value": found.binding_value,
                    "binding_users": found.binding_users,
                    "output_tok_per_s_per_gpu": found.output_tok_per_s_per_gpu,
                    "total_tok_per_s_per_gpu": found.total_tok_per_s_per_gpu,
                    "agents_per_mw": None,
                    "gpus": gpus,
                    "stop_reason": "",
                    "steps": len(runs),
                    "engine_s": None,
                    "line": line,
                }
            )
    return rows, lines


def capacity_results(df: pd.DataFrame, slo: Sequence[SloTier] | None = None) -> CapacityResults:
    """The capacity table of a collected sweep (empty when no cell says anything about capacity)."""
    notes: list[str] = []
    cells = capacity_cells(df, notes)
    rows = _search_rows(cells)
    lines = [row["line"] for row in rows]
    grid_rows, grid_lines = _grid_rows(df, grid_tiers(slo, cells), notes)
    table = pd.DataFrame.from_records([*rows, *grid_rows], columns=list(CAPACITY_COLUMNS))
    return CapacityResults(table=table, lines=[*lines, *grid_lines], cells=cells, notes=notes)
