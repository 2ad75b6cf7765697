"""Validate cell result directories and turn each into one row of summary.csv.

A row always comes out: SUCCESS, FAILED (the cell says so), MALFORMED (the directory breaks the
contract of ARCHITECTURE.md §3-6) or MISSING (the matrix names it, nothing was found). The
``reason`` column says why; ``notes`` carries warnings that do not change the status.

A capacity cell's row carries its verdict and no metrics (its figures are in the capacity table);
each of its steps is a row of its own, right after it, with ``step_of`` naming the capacity cell.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from kv_cache_tester.metrics import finite
from kv_cache_tester.replay import RequestRecord, ResultError, Summary

from agentsweep.collect.discover import FoundCell
from agentsweep.collect.kv_cliff import cliff_columns
from agentsweep.collect.power import power_columns
from agentsweep.collect.provenance import receipt_columns
from agentsweep.collect.routed import routed_figures
from agentsweep.collect.routed_checks import routed_artifact_problems
from agentsweep.collect.stream import RequestStats, stream_requests
from agentsweep.collect.window import NotNumbers, window_figures
from agentsweep.contract import columns
from agentsweep.contract.cell import FLAT_FIELDS, Cell, flat_fields
from agentsweep.contract.cellresult import CellIdentity, CellResult, MalformedResult, load_cell_result
from agentsweep.contract.columns import Unit
from agentsweep.contract.figures import Figures, derived_columns, flat, to_engine_clock
from agentsweep.contract.resultdir import REQUESTS_JSONL, SERVER_LOG, SERVER_METRICS_CSV, SUMMARY_JSON
from agentsweep.contract.resultdir.serverlog import kv_pool_tokens
from agentsweep.energy.summary import PowerSummary, cell_power_summary
from agentsweep.errors import ResultFileError

STATUSES = ("SUCCESS", "INVALID", "FAILED", "MALFORMED", "MISSING")
# Cell fields first, in the cell's flat order (Cell.flat); any other field of cell.json's `cell` follows them.
CELL_COLUMNS = tuple(f for f in FLAT_FIELDS if f != "exp_name")


class Malformed(Exception):
    """The result directory breaks the contract; the message is the row's reason."""


@dataclass
class Row:
    """One cell as collect reads it: what ran (its flat cell, its labels), its verdict and what it
    measured (``figures``, by summary.csv name and unit: ``contract.columns``). summary.csv is its
    rendering (``as_dict``); a reader past summary.csv (the export, the store) takes the row itself and
    reads a figure through ``number``, ``flag`` or ``text``, a nested value through ``result`` and
    ``power``, never a column's JSON text back.
    """

    exp_name: str
    status: str = "SUCCESS"
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    result_dir: str | None = None  # None for a MISSING row (the matrix names it, nothing was found)
    step_of: str | None = None  # the capacity cell a step row is of ("" for a cell; None when MISSING)
    cell_fields: Figures = field(default_factory=dict)  # the cell, one level (Cell.flat)
    # Disaggregation shape, hardware, versions, times, receipt.
    labels: dict[str, str] = field(default_factory=dict)
    figures: Figures = field(default_factory=dict)  # what the cell measured, by summary.csv name
    # What the row was read from (None for a MISSING row and one whose files could not be read): its
    # typed parts, for a reader past summary.csv (the export: the cell, its versions, failures by class).
    result: CellResult | None = None
    power: PowerSummary | None = None  # the power summary its power columns render (None: not read)

    def number(self, name: str) -> float | None:
        """A figure as a number (None when absent, not a number, or not finite)."""
        return finite(self.figures.get(name))

    def flag(self, name: str) -> bool | None:
        value = self.figures.get(name)
        return value if isinstance(value, bool) else None

    def text(self, name: str) -> str:
        """A label (its ``labels``, else a text figure); "" when the row has none."""
        value = self.labels.get(name, self.figures.get(name))
        return value if isinstance(value, str) else ""

    def as_dict(self) -> Figures:
        """The row's summary.csv columns (``to_frame`` orders them)."""
        head: Figures = {"exp_name": self.exp_name, "status": self.status, "reason": self.reason}
        head["notes"] = "; ".join(self.notes)
        if self.result_dir is not None:
            head["result_dir"] = self.result_dir
        if self.step_of is not None:
            head["step_of"] = self.step_of
        return {**head, **self.cell_fields, **self.labels, **self.figures}


def load_cell(found: FoundCell, observe: Callable[[RequestRecord], None] | None = None) -> Row:
    """One row for one result directory; never raises for bad content.

    ``observe`` is handed every record of requests.jsonl as collect recounts them (one pass for a
    reader that needs the records too: the results store); it is not called for a FAILED cell.
    """
    row = Row(found.exp_name, result_dir=str(found.path), step_of=found.step_of)
    try:
        _fill(row, found.path, observe)
    except (Malformed, ResultFileError, ResultError) as err:
        row.status, row.reason = "MALFORMED", str(err)
    except Exception as err:  # defensive: a collect run must list every cell, whatever it holds
        row.status, row.reason = "MALFORMED", f"unexpected {type(err).__name__}: {err}"
    return row


def _fill(row: Row, path: Path, observe: Callable[[RequestRecord], None] | None = None) -> None:
    try:
        result = load_cell_result(path)
    except MalformedResult as err:
        if err.identity is not None:  # what was read before the break still names the cell
            _identity_values(row, err.identity)
        raise
    _identity_values(row, result.identity)
    row.result = result
    status, cell = result.status, result.cell
    if status.verdict == "FAILED":
        row.status = "FAILED"
        row.reason = "; ".join(status.reasons) or (result.record.reason or "") or "no reason given"
        return
    if status.verdict == "INVALID":
        row.status = "INVALID"
        row.reason = "; ".join(status.reasons) or "no reason given"
    assert cell is not None  # only a FAILED record may hold a cell that does not parse
    if result.capacity is not None:
        capacity = result.capacity
        row.notes.append(f"capacity cell: {len(capacity.steps)} steps, stopped: {capacity.stop_reason}")
        return
    assert result.summary is not None  # every SUCCESS and INVALID cell but a capacity cell has one
    summary = result.summary
    client_figures, engine_figures = result.figures()
    figures = row.figures
    gpus = finite(row.cell_fields.get("gpus")) or finite(row.cell_fields.get("tp"))
    figures.update(client_figures)
    figures.update(derived_columns(figures, gpus))

    requests = path / REQUESTS_JSONL
    if not requests.is_file():
        raise Malformed(f"{REQUESTS_JSONL} missing")
    stats = stream_requests(requests, observe)
    figures.update(stats.as_columns())
    if stats.bad_lines:
        row.notes.append(
            f"{REQUESTS_JSONL}: {stats.bad_lines} undecodable lines (first at line {stats.first_bad_line})"
        )
    if figures.get("theoretical_hit_rate") is None:
        figures["theoretical_hit_rate"] = figures["req_theoretical_hit_rate"]

    working_set = sum(stats.lane_peak.values()) if stats.lane_peak else None
    figures.update(cliff_columns(working_set, kv_pool_tokens(path / SERVER_LOG)))
    problems = cross_checks(summary, figures, stats, already_invalid=row.status == "INVALID")
    window = summary["window"]
    start, end = window["start_unix"], window["end_unix"]
    metrics = path / SERVER_METRICS_CSV
    if metrics.is_file():
        try:
            server, notes = window_figures(metrics, start, end)
        except NotNumbers as err:
            problems.append(str(err))
        else:
            figures.update(server)
            row.notes.extend(notes)
    else:
        row.notes.append(f"{SERVER_METRICS_CSV} missing: no server-side figures")
    if cell.routed:
        routed = routed_figures(path, cell, start, end, result.router, result.router_error)
        figures.update(routed.figures)
        row.notes.extend(routed.notes)
        problems.extend(routed.problems)
    row.power = cell_power_summary(path, cell, summary)
    power, notes = power_columns(row.power, cell)  # never changes the status: a withheld figure is a note
    figures.update(power)
    row.notes.extend(notes)
    # The instance files are the ones the cell planned, whole, and merged as they say.
    router_found = result.router is not None or result.router_error is not None
    problems.extend(routed_artifact_problems(path, cell, problems, router_found=router_found))
    if problems:
        row.status = "INVALID"
        row.reason = "; ".join([*([row.reason] if row.reason else []), *(f"collect: {p}" for p in problems)])
    to_engine_clock(figures, finite(row.cell_fields.get("speed")))
    if engine_figures:  # already in the engine's clock: over the rescaled client figures
        figures.update(engine_figures)
        figures.update(derived_columns(figures, gpus))


def _identity_values(row: Row, identity: CellIdentity) -> None:
    """The row's columns of what ran: the cell's fields, its versions and times, its receipt's."""
    record, cell = identity.record, identity.cell
    fields = cell.flat() if cell is not None else flat_fields(record.cell)
    row.cell_fields.update((key, flat(value)) for key, value in fields.items())
    labels = row.labels
    labels["disagg"] = cell.shape_label if cell is not None else ""
    labels[columns.HARDWARE_LABEL.name] = cell.hardware_label if cell is not None else record.hardware or ""
    labels["engine_version"] = record.versions.get("engine") or ""
    labels["agentsweep_version"] = record.versions.get("agentsweep") or ""
    labels["start_utc"] = record.start_utc or ""
    labels["end_utc"] = record.end_utc or ""
    labels.update(receipt_columns(identity.receipt))
    row.notes.extend(identity.notes)


def cross_checks(
    summary: Summary, values: Figures, stats: RequestStats, *, already_invalid: bool = False
) -> list[str]:
    """What the artifacts say against each other; each contradiction is one reason (INVALID)."""
    problems: list[str] = []
    validity = summary.get("validity")
    if validity is None:
        problems.append(f"{SUMMARY_JSON} has no validity record: the run was never checked")
    elif validity.get("valid") is not True and not already_invalid:
        problems.append(f"{SUMMARY_JSON} says the run is not valid")
    sent, ok, failed = (finite(values.get(k)) for k in ("requests_sent", "requests_ok", "requests_failed"))
    warmup = finite(values.get("requests_warmup")) or 0
    if sent is not None and ok is not None and failed is not None and sent != ok + failed:
        problems.append(f"summary counts sent {sent:g} != ok {ok:g} + failed {failed:g}")
    if sent is not None and stats.records != sent + warmup:
        problems.append(
            f"{REQUESTS_JSONL} holds {stats.records} records but the summary counts {sent + warmup:g} "
            "(sent + warmup)"
        )
    if ok is not None and stats.profile_ok != ok:
        problems.append(f"{REQUESTS_JSONL} has {stats.profile_ok} ok profile requests, the summary {ok:g}")
    if stats.impossible:
        problems.append(f"{stats.impossible} records hold impossible values ({stats.first_impossible})")
    for name, value in values.items():
        number = finite(value)
        if number is not None and number < 0 and columns.UNITS.get(name) is not None:
            problems.append(f"{name} is negative ({number:g})")
    return problems


def natural_key(text: str) -> list[tuple[int, int | str]]:
    """Sort key that orders u8 before u32."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text)]


def missing_row(cell: Cell) -> Row:
    row = Row(cell.exp_name, "MISSING", "no result directory found (cell never ran or its upload failed)")
    _matrix_fields(row, cell)
    return row


def _matrix_fields(row: Row, cell: Cell) -> None:
    """The matrix cell's fields, where the row has none of its own (a malformed cell.json, say)."""
    for key, value in cell.flat().items():
        if key != "exp_name":
            row.cell_fields.setdefault(key, flat(value))
    row.labels.setdefault("disagg", cell.shape_label)
    row.labels.setdefault(columns.HARDWARE_LABEL.name, cell.hardware_label)


def build_rows(found: list[FoundCell], matrix: list[Cell] | None = None) -> list[Row]:
    """Rows for every found directory and every matrix cell, in matrix order then by name."""
    rows: dict[str, Row] = {}
    extra: list[Row] = []
    for cell in found:
        row = load_cell(cell)
        if row.exp_name in rows:
            dup = Row(
                row.exp_name,
                "MALFORMED",
                f"duplicate exp_name (also at {rows[row.exp_name].result_dir})",
                result_dir=str(cell.path),
            )
            extra.append(dup)
            continue
        rows[row.exp_name] = row
    ordered: list[Row] = []
    if matrix is not None:
        for spec in matrix:
            if spec.exp_name in rows:
                row = rows.pop(spec.exp_name)
                _matrix_fields(row, spec)
                ordered.append(row)
            elif spec.exp_name not in {r.exp_name for r in ordered}:
                ordered.append(missing_row(spec))
        for row in rows.values():
            if not row.step_of:
                row.notes.append("not in the matrix")
    ordered.extend(sorted(rows.values(), key=lambda r: natural_key(r.exp_name)))
    ordered.extend(extra)
    return _steps_after_their_cell(ordered)


def _steps_after_their_cell(rows: list[Row]) -> list[Row]:
    """A capacity cell's step rows right after its own row (in the order found: step order)."""
    parents = {r.exp_name for r in rows if not r.step_of}
    steps: dict[str, list[Row]] = {}
    for row in rows:
        parent = row.step_of or ""
        if parent in parents:
            steps.setdefault(parent, []).append(row)
    out: list[Row] = []
    for row in rows:
        parent = row.step_of or ""
        if parent in parents:
            continue  # placed after its capacity cell
        out.append(row)
        if not parent:
            out.extend(steps.pop(row.exp_name, []))
    return out


METRIC_COLUMNS = tuple(column.name for column in columns.METRICS)
TEXT_UNITS = (Unit.JSON, Unit.LABEL)


def to_frame(rows: list[Row]) -> pd.DataFrame:
    """summary.csv as a DataFrame: identity, cell fields, other cell facts, metrics, notes.

    The metric columns are always all present (empty where no cell has a value), so readers
    never depend on which cells happened to succeed.
    """
    df = pd.DataFrame.from_records([r.as_dict() for r in rows])
    head = ["exp_name", "status", "reason", *[c for c in CELL_COLUMNS if c in df.columns]]
    head += [columns.HARDWARE_LABEL.name, *columns.SHAPE_DERIVED]
    tail = ["notes", "result_dir"]
    facts = [c for c in df.columns if c not in head and c not in tail and c not in METRIC_COLUMNS]
    df = df.reindex(columns=head + facts + list(METRIC_COLUMNS) + tail)
    for column in METRIC_COLUMNS:
        if columns.UNITS[column] not in TEXT_UNITS:
            df[column] = pd.to_numeric(df[column], errors="coerce").astype(float)
    return df
