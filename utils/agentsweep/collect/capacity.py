"""The capacity table (capacity.csv: tier × cell) and its plain lines, from the collected rows.

Two sources, each row marked with it:

- ``search``: a capacity cell's capacity.json, as the cell wrote it (per tier its boundary, interval,
  binding constraint, boundary type and stop reason);
- ``grid``: an ordinary sweep's cells, per series (config key, engine, offload, router, shape, TP),
  read off the grid of user counts by ``agentsweep.capacity.grid`` (interpolated between the cells
  that bracket a boundary, and marked so; a series of one count says "at least" or "none"). The tiers
  are ``--slo`` when given, else the tiers of the sweep's capacity cells, else the default tiers.

Each row also names what it was measured on (model, hardware, engine, TP, offload, router, shape) so
that the headline (collect.headline) can pick the best configuration per tier from this table alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from kv_cache_tester.metrics import finite

from agentsweep.capacity.grid import GridCapacity, GridRun, grid_capacity
from agentsweep.capacity.measure import run_figures
from agentsweep.collect.table import TableRow
from agentsweep.contract.cell import Cell
from agentsweep.contract.cellresult import CellResult
from agentsweep.contract.resultdir import CapacityRecord, read_capacity, read_cell_record
from agentsweep.contract.slo import DEFAULT_TIERS, SloConstraint, SloTier, distinct_constraints
from agentsweep.errors import InputError

# The configuration a capacity row belongs to (summary.csv's own columns; ``hardware`` as hardware_of).
CONFIG_COLUMNS = (
    "config_key",
    "model",
    "hardware",
    "engine",
    "tp",
    "offload",
    "router",
    "disagg",
    "replicas",
)
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
    # What the row was measured on, and the fewest runs any measured count had.
    "binding_text",
    "repeats",
    *CONFIG_COLUMNS,
)
GRID_KEYS = ("config_key", "engine", "offload", "router", "disagg", "tp")

# The rows' CellResults (collect's Row.result) by their result_dir column: a row found here takes its
# cell, capacity.json and summary.json from what collect read; one not found is read from its directory.
Results = Mapping[str, CellResult]


@dataclass
class CapacityCell:
    """A capacity cell as collected: its cell and capacity.json (for the table, lines and plots)."""

    exp_name: str
    cell: Cell
    record: CapacityRecord
    result_dir: Path
    facts: TableRow = field(default_factory=dict)  # its summary.csv row's CONFIG_COLUMNS


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


def hardware_of(row: TableRow) -> str:
    """The hardware a row ran on as collect's table says it: its label ("simulated H200", "B200") where
    the table has one, else its ``hardware`` column, else its runner."""
    return _text(row.get("hardware_label")) or _text(row.get("hardware")) or _text(row.get("runner"))


def config_facts(row: TableRow) -> TableRow:
    """A summary.csv row's CONFIG_COLUMNS (text empty where absent)."""
    out: TableRow = {c: row.get(c) for c in CONFIG_COLUMNS}
    out["hardware"] = hardware_of(row)
    for c in ("config_key", "model", "engine", "offload", "router", "disagg"):
        out[c] = _text(out[c])
    return out


def _is_capacity_row(row: TableRow) -> bool:
    return bool(_text(row.get("capacity")))


def _held(results: Results | None, row: TableRow) -> CellResult | None:
    """The row's CellResult when it holds the parsed cell (a FAILED cell whose cell does not parse
    holds neither it nor its capacity.json: such a row is read from its directory, for the note)."""
    result = results.get(str(row["result_dir"])) if results is not None else None
    return result if result is not None and result.cell is not None else None


def capacity_cells(df: pd.DataFrame, notes: list[str], results: Results | None = None) -> list[CapacityCell]:
    """Every capacity cell of the table that left a readable capacity.json."""
    out: list[CapacityCell] = []
    for row in df.to_dict("records"):
        if not _is_capacity_row(row) or row.get("status") in ("MALFORMED", "MISSING"):
            continue
        path = Path(str(row["result_dir"]))
        held = _held(results, row)
        try:
            if held is not None:
                record, cell = held.capacity, held.cell
            else:
                record = read_capacity(path)
                cell_record = read_cell_record(path)
                cell = cell_record.parse_cell() if cell_record is not None else None
        except InputError as err:
            notes.append(f"{row['exp_name']}: {err}")
            continue
        if record is None or cell is None or cell.capacity is None:
            continue
        out.append(CapacityCell(str(row["exp_name"]), cell, record, path, config_facts(row)))
    return out


def fewest_runs(users: Sequence[int]) -> int:
    """The fewest runs any measured user count had (1: some count has no run-to-run spread)."""
    return min(Counter(users).values()) if users else 0


def _binding_text(tiers: Sequence[SloTier], tier: str, binding: str | None, value: float | None) -> str:
    """The binding statistic's value as its constraint writes it (``11.2 s``); empty for validity."""
    if binding is None or value is None:
        return ""
    for found in tiers:
        if found.name == tier:
            for constraint in found.constraints:
                if constraint.statistic_label == binding:
                    return constraint.format_value(value)
    return ""


def search_rows(cells: Sequence[CapacityCell]) -> list[TableRow]:
    rows = []
    for item in cells:
        spec = item.cell.capacity
        assert spec is not None
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
                    "binding_text": _binding_text(spec.tiers, tier.tier, tier.binding, tier.binding_value),
                    "repeats": fewest_runs([s.users for s in item.record.steps]),
                    **item.facts,
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


def _series_label(key: TableRow, several_keys: bool) -> str:
    label = f"{key['engine']} offload={key['offload']}"
    for part in ("router", "disagg"):
        if _text(key.get(part)):
            label += f" {part}={key[part]}"
    tp = key.get("tp")
    label += f" tp={int(tp) if isinstance(tp, float) and tp.is_integer() else tp}"
    return f"{key['config_key']} {label}" if several_keys else label


# What a grid member measured: (the cell's GPUs, the member as a run at its user count), or None
# when it cannot be read. Collect reads each result directory; the dashboard the store's figures.
GridReader = Callable[[TableRow, Sequence[SloConstraint]], "tuple[int, GridRun] | None"]


def result_dir_reader(notes: list[str], results: Results | None = None) -> GridReader:
    """A GridReader over a row's result directory (its requests.jsonl; its cell.json and summary.json
    as its CellResult in ``results`` holds them, else read here)."""

    def read(member: TableRow, constraints: Sequence[SloConstraint]) -> tuple[int, GridRun] | None:
        path = Path(str(member["result_dir"]))
        held = _held(results, member)
        summary = held.summary if held is not None else None
        try:
            if held is not None:
                cell = held.cell
            else:
                cell_record = read_cell_record(path)
                cell = cell_record.parse_cell() if cell_record is not None else None
        except InputError as err:
            notes.append(f"{member['exp_name']}: {err}")
            return None
        if cell is None:
            return None
        figures = run_figures(path, cell, constraints, summary)
        return cell.gpus, GridRun(
            users=cell.users,
            status=str(member["status"]),
            statistics=figures.statistics,
            reasons=(str(member.get("reason") or ""),) if member.get("reason") else (),
            output_tok_per_s_per_gpu=figures.output_tok_per_s_per_gpu,
            total_tok_per_s_per_gpu=figures.total_tok_per_s_per_gpu,
            kv_working_set_tokens=figures.kv_working_set_tokens,
            kv_pool_tokens=figures.kv_pool_tokens,
        )

    return read


def grid_rows(
    df: pd.DataFrame, tiers: Sequence[SloTier], read: GridReader
) -> tuple[list[TableRow], list[str]]:
    """capacity.csv's grid rows (and their lines): per series of ordinary cells, each tier's reading."""
    if df.empty or "status" not in df.columns:
        return [], []
    records = [
        r
        for r in df.to_dict("records")
        if r.get("status") in ("SUCCESS", "INVALID")
        and not _is_capacity_row(r)
        and not _text(r.get("step_of"))
    ]
    groups: dict[tuple[str, ...], list[TableRow]] = {}
    for r in records:
        groups.setdefault(tuple(_text(r.get(k)) for k in GRID_KEYS), []).append(r)
    several_keys = len({k[0] for k in groups}) > 1
    constraints = distinct_constraints(tuple(tiers))
    rows: list[TableRow] = []
    lines: list[str] = []
    for key, members in groups.items():
        runs: list[GridRun] = []
        gpus = 1
        power: dict[int, list[float]] = {}
        for member in members:
            found_run = read(member, constraints)
            if found_run is None:
                continue
            gpus, run = found_run
            watts = finite(member.get("avg_power_w"))
            if watts is not None and member.get("status") == "SUCCESS":
                power.setdefault(run.users, []).append(watts)
            runs.append(run)
        label = _series_label(dict(zip(GRID_KEYS, key, strict=True)), several_keys)
        facts = config_facts(members[0])
        repeats = fewest_runs([r.users for r in runs])
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
                    "agents_per_mw": _grid_agents_per_mw(found, power),
                    "gpus": gpus,
                    "stop_reason": "",
                    "steps": len(runs),
                    "engine_s": None,
                    "line": line,
                    "binding_text": found.binding_text if found.binding_value is not None else "",
                    "repeats": repeats,
                    **facts,
                }
            )
    return rows, lines


def _grid_agents_per_mw(found: GridCapacity, power: dict[int, list[float]]) -> float | None:
    """Agents per MW at a grid boundary: its users over the mean GPU power (every GPU of the cell) of
    the SUCCESS cells there; an interpolated boundary's power is interpolated the same way between the
    two cells around it. None where those cells measured no valid power."""

    def mean_w(users: int | None) -> float | None:
        values = power.get(users) if users is not None else None
        return math.fsum(values) / len(values) if values else None

    if found.kind == "none" or found.boundary_users <= 0 or found.passing is None:
        return None
    watts = mean_w(found.passing)
    if found.kind == "interpolated" and found.failing is not None:
        above = mean_w(found.failing)
        if watts is None or above is None:
            return None
        share = (found.boundary_users - found.passing) / (found.failing - found.passing)
        watts = watts + share * (above - watts)
    return found.boundary_users / (watts / 1e6) if watts else None


def capacity_results(
    df: pd.DataFrame, slo: Sequence[SloTier] | None = None, results: Results | None = None
) -> CapacityResults:
    """The capacity table of a collected sweep (empty when no cell says anything about capacity);
    ``results``: the rows' CellResults, so that what collect read is not read again."""
    notes: list[str] = []
    cells = capacity_cells(df, notes, results)
    rows = search_rows(cells)
    lines = [str(row["line"]) for row in rows]
    grid, grid_lines = grid_rows(df, grid_tiers(slo, cells), result_dir_reader(notes, results))
    table = pd.DataFrame.from_records([*rows, *grid], columns=list(CAPACITY_COLUMNS))
    return CapacityResults(table=table, lines=[*lines, *grid_lines], cells=cells, notes=notes)
