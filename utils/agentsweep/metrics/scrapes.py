"""server_metrics*.csv read back: the one reader of the scrapes, beside the columns they hold
(``dialects.COLUMNS``), and the merge of several engine instances' scrapes into one file. The
router's scrapes (router_metrics.csv, same layout, its own columns) are read the same way.

A file is read a row at a time, in file order, never whole. A row is unreadable (counted in
``bad_rows``, skipped) when it has another number of cells than the header, its ``time_s`` is not a
number, or it is longer than ROW_MAX_BYTES. In a readable row an empty cell is a figure the engine
did not report (None), never a zero; a cell holding text (or inf, nan) is None too and ``not_number``
names the first such cell, so a reader decides whether that spoils the file.
"""

from __future__ import annotations

import bisect
import csv
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kv_cache_tester.inputfiles import InputFileProblem, open_regular

from agentsweep.contract.resultdir.fileio import finite_number
from agentsweep.errors import ResultFileError
from agentsweep.metrics.dialects import COLUMNS, format_row

# A row is well under a KiB; a longer line is not one.
ROW_MAX_BYTES = 64 << 10
# Merged by their mean (each instance reports the fraction of its own pool); the other columns add up.
MEAN_COLUMNS = frozenset({"kv_cache_usage", "cpu_kv_cache_usage"})
FIGURES = COLUMNS[1:]


@dataclass(frozen=True, slots=True)
class Scrape:
    """One readable row: its Unix time and every column's figure (None: empty, text, or not in the file)."""

    time_s: float
    values: dict[str, float | None]
    not_number: tuple[str, str] | None = None  # (column, text) of the first cell that is not a number


class ScrapeReader:
    """The readable rows of one server_metrics*.csv, in file order (iterate it; each iteration reads
    the file again).

    ResultFileError (``<name> missing``, ``<name>: not a regular file (a FIFO)``, ``<name>: no time_s
    column``) when the file cannot be read as one. After an iteration, ``header`` is the file's,
    ``missing`` the columns of ``figures`` it lacks and ``bad_rows`` the rows skipped.

    ``figures`` are the columns read (default: the engine-neutral COLUMNS); None reads every column of
    the header, for the router's scrapes (router_metrics.csv: ``requests.<instance>`` per instance).
    """

    def __init__(self, path: Path, figures: Sequence[str] | None = FIGURES) -> None:
        self.path = path
        self.name = path.name
        self.wanted = None if figures is None else tuple(figures)
        self.figures: tuple[str, ...] = self.wanted or ()
        self.header: tuple[str, ...] = ()
        self.missing: tuple[str, ...] = ()
        self.bad_rows = 0

    def __iter__(self) -> Iterator[Scrape]:
        self.bad_rows = 0
        if not self.path.exists() and not self.path.is_symlink():
            raise ResultFileError(f"{self.name} missing")
        try:
            fh = open_regular(self.path, follow_links=False)
        except InputFileProblem as err:
            raise ResultFileError(f"{self.name}: {err}") from None
        with fh:
            rows = csv.reader(_lines(fh, self))
            try:
                self.header = tuple(next(rows, []))
                if "time_s" not in self.header:
                    raise ResultFileError(f"{self.name}: no time_s column")
                if self.wanted is None:
                    self.figures = tuple(c for c in self.header if c != "time_s")
                self.missing = tuple(c for c in self.figures if c not in self.header)
                yield from self._scrapes(rows)
            except csv.Error as err:
                raise ResultFileError(f"{self.name}: line {rows.line_num}: {err}") from None
            except OSError as err:
                raise ResultFileError(f"{self.name}: unreadable ({err.strerror or err})") from None

    def _scrapes(self, rows: Iterator[list[str]]) -> Iterator[Scrape]:
        width = len(self.header)
        at = self.header.index("time_s")
        where = [(c, self.header.index(c)) for c in self.figures if c in self.header]
        for row in rows:
            if not row:
                continue
            t = finite_number(row[at]) if len(row) == width else None
            if t is None:
                self.bad_rows += 1
                continue
            values: dict[str, float | None] = dict.fromkeys(self.figures)
            not_number: tuple[str, str] | None = None
            for column, i in where:
                text = row[i].strip()
                if text:
                    value = finite_number(text)
                    values[column] = value
                    if value is None and not_number is None:
                        not_number = (column, row[i])
            yield Scrape(t, values, not_number)


def _lines(fh: BinaryIO, reader: ScrapeReader) -> Iterator[str]:
    """The file's lines as text (undecodable bytes replaced); a line over ROW_MAX_BYTES is skipped,
    never held whole, and counted in ``reader.bad_rows``."""
    while True:
        line = fh.readline(ROW_MAX_BYTES + 1)
        if not line:
            return
        if len(line) > ROW_MAX_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = fh.readline(ROW_MAX_BYTES)
            reader.bad_rows += 1
            continue
        yield line.decode("utf-8", "replace")


def read_scrapes(path: Path) -> list[Scrape]:
    """Every readable row of a server_metrics*.csv (see ScrapeReader; for files known to be small)."""
    return list(ScrapeReader(path))


def merge_metrics(inputs: Sequence[Path], output: Path) -> int:
    """Write ``output`` (server_metrics.csv) from per-instance CSVs; returns the rows written.

    Rows are matched to the first instance's scrape times (the nearest row of every other instance,
    the last rows with each other). A time some instance has no row near is left out rather than
    written with that instance missing; an empty figure in any instance leaves the merged figure empty.
    Counters and request counts are summed, usage fractions averaged. An instance whose file is
    missing or is not a server_metrics.csv leaves only the header; a column an instance's file lacks
    (written before the column existed) is empty.
    """
    out_rows = merged_rows(inputs)
    tmp = output.with_suffix(".csv.tmp")
    try:
        with tmp.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(COLUMNS)
            writer.writerows(out_rows)
        tmp.replace(output)
    except OSError as err:  # a full disk: no temporary file stays behind; the error names the file
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(output)) from err
    return len(out_rows)


def merged_rows(inputs: Sequence[Path]) -> list[list[str]]:
    """The rows ``merge_metrics`` writes for ``inputs`` (collect recomputes them to check the file)."""
    tables = [_instance_rows(p) for p in inputs]
    out_rows: list[list[str]] = []
    if tables and all(tables):
        times = [[row.time_s for row in table] for table in tables]
        gaps = [b - a for t in times for a, b in itertools.pairwise(t)]
        tolerance = 0.75 * (sorted(gaps)[len(gaps) // 2] if gaps else 1.0)
        ref = tables[0]
        for k, row in enumerate(ref):
            last = k == len(ref) - 1
            picks = [row]
            for table, ts in zip(tables[1:], times[1:], strict=True):
                j = len(ts) - 1 if last else _nearest(ts, row.time_s)
                if not last and abs(ts[j] - row.time_s) > tolerance:
                    break
                picks.append(table[j])
            else:
                out_rows.append(format_row(row.time_s, _combine(picks)))
    return out_rows


def _instance_rows(path: Path) -> list[Scrape]:
    """An instance's rows; none when its file is missing or is not a server_metrics.csv.

    A file written before a column was added (evicted_tokens_total) lacks it: its header is then a
    subset of COLUMNS, and the column reads as absent (empty in the merge), never as zero rows.
    """
    reader = ScrapeReader(path)
    try:
        rows = list(reader)
    except ResultFileError:
        return []
    header = reader.header
    ours = header[:1] == ("time_s",) and len(set(header)) == len(header) and set(header) <= set(COLUMNS)
    return rows if ours else []


def _nearest(ts: list[float], t: float) -> int:
    i = bisect.bisect_left(ts, t)
    if i == 0:
        return 0
    if i == len(ts):
        return len(ts) - 1
    return i if ts[i] - t < t - ts[i - 1] else i - 1


def _combine(rows: Sequence[Scrape]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in FIGURES:
        values = [row.values[name] for row in rows]
        if any(v is None for v in values):
            out[name] = None
            continue
        numbers = [v for v in values if v is not None]
        out[name] = sum(numbers) / len(numbers) if name in MEAN_COLUMNS else float(sum(numbers))
    return out
