"""Collect's cross-checks of a cell's engine-instance artifacts: are the files the ones its plan makes?

A routed cell plans engine instances (``r<i>``, or ``p<i>`` and ``d<i>``: ``Cell.instance_names``), each
scraped into ``server_metrics.<name>.csv``, a router whose figures are ``router.json`` and whose scrapes
are ``router_metrics.csv``, and merged tables (``server_metrics.csv`` of the client-facing instances,
``server_metrics.prefill.csv`` of the prefill ones). Each problem is one line; collect prefixes it with
``collect:`` and the row is INVALID:

- a planned instance without its metrics file, or a routed cell without router.json;
- an instance file (metrics, metrics sources, log, collector log) of an instance the cell did not plan
  (a single-engine cell plans none);
- an instance's scrapes holding text where numbers belong, or a counter going down;
- router_metrics.csv counting requests for an instance the cell did not plan, or none for a planned one;
- a merged table that is not the merge of its instances' scrapes (recomputed as the cell merged them).
"""

from __future__ import annotations

import re
from pathlib import Path

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import (
    PREFILL_METRICS_CSV,
    ROUTER_JSON,
    ROUTER_METRICS_CSV,
    SERVER_METRICS_CSV,
    instance_metrics_csv,
)
from agentsweep.contract.resultdir.fileio import finite_number
from agentsweep.errors import ResultFileError
from agentsweep.metrics.dialects import COLUMNS
from agentsweep.metrics.scrapes import ScrapeReader, merged_rows

# Files that belong to one engine instance, by the instance's name.
INSTANCE_FILE = re.compile(
    r"^(?:server_metrics\.(?P<m>[^./]+)\.csv|server_metrics\.(?P<s>[^./]+)\.sources\.json"
    r"|server\.(?P<l>[^./]+)\.log|metrics-collector\.(?P<c>[^./]+)\.log)$"
)
# server_metrics.prefill.csv is a merged table, not an instance's file.
NOT_INSTANCES = frozenset({"prefill"})
# Merged figures are written from the instances' as text: a relative difference under this is the same.
SAME = 1e-9


def _planned(cell: Cell) -> tuple[list[str], list[str], list[str]]:
    """(every planned instance, the client-facing ones, the prefill ones)."""
    names = cell.instance_names
    prefill = [n for n in names if n.startswith("p")]
    return names, [n for n in names if n not in prefill], prefill


def stray_files(path: Path, planned: list[str]) -> list[str]:
    """Instance files of instances the cell did not plan."""
    out = []
    for entry in sorted(path.iterdir(), key=lambda p: p.name):
        match = INSTANCE_FILE.match(entry.name)
        if not match:
            continue
        name = next(v for v in match.groups() if v is not None)
        if name not in planned and name not in NOT_INSTANCES:
            whose = f"the cell's instances are {', '.join(planned)}" if planned else "the cell has one engine"
            out.append(f"{entry.name}: belongs to no planned engine instance ({whose})")
    return out


def instance_file_problem(path: Path) -> str | None:
    """Text where numbers belong or a counter going down in one instance's scrapes, or None."""
    last: dict[str, float] = {}
    try:
        for scrape in ScrapeReader(path):
            if scrape.not_number is not None:
                column, text = scrape.not_number
                return f"{path.name}: {column}={text[:40]!r} at time_s {scrape.time_s:.3f} is not a number"
            for column, value in scrape.values.items():
                if value is None or not column.endswith("_total"):
                    continue
                if value < last.get(column, value):
                    return f"{path.name}: {column} goes down at time_s {scrape.time_s:.3f}"
                last[column] = value
    except ResultFileError as err:
        return str(err)
    return None


def router_columns_problem(path: Path, planned: list[str]) -> str | None:
    """router_metrics.csv counting requests for other instances than the planned ones, or None."""
    reader = ScrapeReader(path / ROUTER_METRICS_CSV, figures=None)
    try:
        for scrape in reader:
            if scrape.not_number is not None:
                column, text = scrape.not_number
                return f"{ROUTER_METRICS_CSV}: {column}={text[:40]!r} is not a number"
    except ResultFileError as err:
        return str(err)
    named = [c.removeprefix("requests.") for c in reader.figures if c.startswith("requests.")]
    others = [c for c in reader.figures if not c.startswith("requests.")]
    unknown = [n for n in named if n not in planned] + others
    if unknown:
        return (
            f"{ROUTER_METRICS_CSV}: counts requests for {', '.join(unknown[:5])}, not a planned engine "
            f"instance ({', '.join(planned)})"
        )
    missing = [n for n in planned if n not in named]
    if missing:
        return f"{ROUTER_METRICS_CSV}: no column for planned instance(s) {', '.join(missing)}"
    return None


def merged_problem(path: Path, merged: str, instances: list[str]) -> str | None:
    """A merged table that is not the merge of its instances' scrapes, or None."""
    expected = merged_rows([path / instance_metrics_csv(n) for n in instances])
    reader = ScrapeReader(path / merged)
    try:
        found = list(reader)
    except ResultFileError as err:
        return str(err)
    if len(found) != len(expected):
        return (
            f"{merged}: {len(found)} rows, but its instances ({', '.join(instances)}) merge into "
            f"{len(expected)}"
        )
    for scrape, row in zip(found, expected, strict=True):
        for column, text in zip(COLUMNS, row, strict=True):
            want = finite_number(text) if text else None
            got = scrape.time_s if column == "time_s" else scrape.values.get(column)
            if (want is None) != (got is None) or (
                want is not None and got is not None and abs(got - want) > SAME * max(1.0, abs(want))
            ):
                return (
                    f"{merged}: {column} {got} at time_s {scrape.time_s:.3f}, but its instances "
                    f"({', '.join(instances)}) sum to {want}"
                )
    return None


def routed_artifact_problems(
    path: Path, cell: Cell, already: list[str] | None = None, *, router_found: bool
) -> list[str]:
    """Every problem of the cell's instance artifacts (one line each, without ``collect:``); a file a
    problem in ``already`` names is not reported again. ``router_found``: the cell left a router.json
    (read or not: ``CellResult.router`` or ``router_error``)."""
    planned, main, prefill = _planned(cell)
    problems = stray_files(path, planned)
    if not cell.routed:
        return problems
    if not router_found:
        problems.append(f"{ROUTER_JSON} missing: a routed cell writes it")
    readable = True
    for name in planned:
        file = instance_metrics_csv(name)
        if any(p.startswith(file) for p in already or ()):
            readable = False
            continue
        if not (path / file).exists():
            problems.append(f"{file} missing: planned engine instance {name} left no scrapes")
            readable = False
            continue
        problem = instance_file_problem(path / file)
        if problem:
            problems.append(problem)
            readable = False
    if (path / ROUTER_METRICS_CSV).exists():
        problem = router_columns_problem(path, planned)
        if problem:
            problems.append(problem)
    if readable:  # the merges can only be recomputed from readable instances
        for merged, instances in ((SERVER_METRICS_CSV, main), (PREFILL_METRICS_CSV, prefill)):
            if instances and (path / merged).exists():
                problem = merged_problem(path, merged, instances)
                if problem:
                    problems.append(problem)
    return problems
