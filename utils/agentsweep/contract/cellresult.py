"""What one cell measured, read once from its result directory (ARCHITECTURE.md §3) through each file's
owner: cell.json (``CellRecord``), the receipt (checked against the directory), status.txt
(``CellStatus``), capacity.json (``CapacityRecord``), summary.json (the replayer's ``Summary``, with
its figures as summary.csv names them: ``contract.figures``) and router.json (``RouterRecord``).

The files are read in that order and held to their contracts together (status.txt repeats cell.json's
verdict, a capacity cell has its capacity.json); the first break is a ``MalformedResult`` carrying what
was read before it, so a reader that lists every cell (collect) still shows what the cell was. router.json
is read last and held with its own error: one that breaks its contract breaks no other file's, so it
is no MalformedResult; collect's routed figures make a routed cell INVALID for it.

A FAILED cell has no summary, nor has a capacity cell (its figures are its steps' and capacity.json's).
The request records, the scrapes and the power samples are streamed by their readers, never held here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kv_cache_tester.replay import ResultError, Summary, Window, load_summary

from agentsweep.contract.cell import Cell
from agentsweep.contract.figures import Figures, engine_clock_columns, summary_columns
from agentsweep.contract.receipt import Receipt, ReceiptMismatch, checked_receipt
from agentsweep.contract.resultdir import (
    CAPACITY_JSON,
    CELL_JSON,
    RECEIPT_JSON,
    STATUS_TXT,
    CapacityRecord,
    CellRecord,
    CellStatus,
    RouterRecord,
    read_capacity,
    read_cell_record,
    read_router,
    read_status,
)
from agentsweep.errors import ResultFileError

NO_RECEIPT_NOTE = f"no {RECEIPT_JSON}: not checked against one"


@dataclass(frozen=True)
class CellIdentity:
    """What ran and what produced it: cell.json, and the receipt the directory matches (None without
    one; ``notes`` then says so)."""

    record: CellRecord
    cell: Cell | None  # None only for a FAILED record whose cell does not parse (refused for bad input)
    receipt: Receipt | None = None
    notes: tuple[str, ...] = ()  # warnings that change no verdict


class MalformedResult(ResultFileError):
    """A result directory that breaks its contract; the message says where. ``identity`` is what was
    read before the break (None when cell.json itself broke), ``receipt`` included once checked."""

    def __init__(self, message: str, identity: CellIdentity | None = None) -> None:
        super().__init__(message)
        self.identity = identity


@dataclass(frozen=True)
class CellResult:
    """One cell's result directory, read and checked: its identity, its verdict and what it measured."""

    path: Path
    identity: CellIdentity
    status: CellStatus  # status.txt, the same verdict as cell.json's
    capacity: CapacityRecord | None = None  # a capacity cell's search (None for a FAILED one without it)
    summary: Summary | None = None  # None for a FAILED cell and a capacity cell
    router: RouterRecord | None = None  # None without router.json (one engine) or when it breaks
    router_error: str | None = None  # why router.json breaks its contract (then ``router`` is None)

    @property
    def record(self) -> CellRecord:
        return self.identity.record

    @property
    def cell(self) -> Cell | None:
        return self.identity.cell

    def figures(self) -> tuple[Figures, Figures]:
        """(client, engine): the summary's figures as summary.csv columns, the client's own with the
        engine-clock columns beside them (``contract.figures.engine_clock_columns``), and the figures
        the engine's timelines give (empty for every real engine); both empty without a summary."""
        if self.summary is None:
            return {}, {}
        client = summary_columns(self.summary)
        beside, engine = engine_clock_columns(self.summary)
        client.update(beside)
        return client, engine

    @property
    def failed_by_class(self) -> Mapping[str, int]:
        """The failed requests per error class (summary.json ``counts.failed_by_class``), by class name;
        empty without a summary."""
        if self.summary is None:
            return {}
        return dict(sorted((self.summary["counts"].get("failed_by_class") or {}).items()))

    @property
    def window(self) -> Window | None:
        """The profiling window (summary.json ``window``); None without a summary."""
        return self.summary["window"] if self.summary is not None else None

    @property
    def preset_deviations(self) -> tuple[str, ...]:
        """Where the run departs from its replay preset (summary.json ``preset.deviations``); empty for a
        run without a preset or without a summary."""
        preset = self.summary.get("preset") if self.summary is not None else None
        return tuple(str(d) for d in preset["deviations"]) if preset is not None else ()


def load_cell_result(path: Path) -> CellResult:
    """The result directory at ``path``; MalformedResult at the first file that breaks its contract."""
    record = read_cell_record(path)
    if record is None:
        raise MalformedResult(f"{CELL_JSON} missing")
    cell: Cell | None = None
    try:
        cell = record.parse_cell()
    except ResultFileError:
        if record.status != "FAILED":  # a cell refused for bad input keeps what it was given
            raise
    try:
        receipt = checked_receipt(path)
    except ReceiptMismatch as err:
        raise MalformedResult(str(err), CellIdentity(record, cell)) from None
    identity = CellIdentity(record, cell, receipt, () if receipt is not None else (NO_RECEIPT_NOTE,))
    try:
        return _rest(path, identity)
    except MalformedResult:
        raise
    except (ResultFileError, ResultError) as err:
        raise MalformedResult(str(err), identity) from None


def _rest(path: Path, identity: CellIdentity) -> CellResult:
    """status.txt, capacity.json, summary.json and router.json, after cell.json and the receipt."""
    record, cell = identity.record, identity.cell
    status = read_status(path)
    if status is None:
        raise MalformedResult(f"{STATUS_TXT} missing", identity)
    if status.verdict != record.status:
        raise MalformedResult(
            f"{STATUS_TXT} says {status.verdict} but {CELL_JSON} says {record.status}", identity
        )
    capacity = None
    if cell is not None and cell.capacity is not None:
        # Held to its own contract, its cell and its steps whatever the verdict: a capacity.json that
        # breaks them never reaches capacity.csv.
        capacity = read_capacity(path)
        if capacity is None and status.verdict != "FAILED":
            raise MalformedResult(f"{CAPACITY_JSON} missing", identity)
        problem = capacity.check_against(cell, status.verdict, path) if capacity is not None else None
        if problem:
            raise MalformedResult(problem, identity)
    summary = None if status.verdict == "FAILED" or capacity is not None else load_summary(path)
    router, router_error = _router(path)
    return CellResult(path, identity, status, capacity, summary, router, router_error)


def _router(path: Path) -> tuple[RouterRecord | None, str | None]:
    """(router.json, why it breaks its contract): (None, None) without one."""
    try:
        return read_router(path), None
    except ResultFileError as err:
        return None, str(err)
