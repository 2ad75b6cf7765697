"""`agentsweep export --format inferencex DIR -o FILE [--shape flat|nested] [--include-invalid]`.

Writes one JSON array: one InferenceX agentic row per SUCCESS point of the sweep under DIR (INVALID
and FAILED cells only with --include-invalid, each with its ``outcome``; MALFORMED directories never).
Points of different replayer versions, or one curve of different recipes, are refused (exit 2, naming
what differs) unless --allow-mixed, as in collect.
Every row is checked against the shipped JSON Schema of its shape before the file is written; a row
that breaks it is an error naming the cell and the field, and nothing is written. Exit 0 on success,
2 on bad input (no cells, an output path that cannot be written, or one that holds something other
than a regular file: a FIFO, a device, a folder or a link there is refused, never replaced).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, cast

from agentsweep.collect.aggregate import CELL_COLUMNS, load_cell, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.collect.provenance import mixed_in_sweep, refuse_mixed
from agentsweep.contract.resultdir import read_cell_record
from agentsweep.errors import AgentsweepError, InputError, ResultFileError
from agentsweep.export.build import Point, flat_row, nested_row
from agentsweep.export.models import Outcome
from agentsweep.export.schema import Shape, problems
from agentsweep.outputfile import check_target, write_text

POINTS = ("SUCCESS",)
WITH_INVALID = ("SUCCESS", "INVALID", "FAILED")


class ExportError(AgentsweepError):
    """A row breaks its shipped schema: a defect of the exporter, not of the input."""

    prefix = "export error"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="a sweep's result directories (results/<key>)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--format", choices=("inferencex",), default="inferencex", help="row format")
    parser.add_argument(
        "--shape",
        choices=("flat", "nested"),
        default="flat",
        help="flat: InferenceX's dashboard loader's keys; nested: agentx-v1 (default flat)",
    )
    parser.add_argument(
        "--allow-mixed",
        action="store_true",
        help="export points of different replayer versions, or one curve's points of different recipes "
        "(refused by default, naming what differs, as collect does)",
    )
    parser.add_argument(
        "--include-invalid",
        action="store_true",
        help="also write INVALID and FAILED cells (each row states its outcome)",
    )


def points(results: Path, include_invalid: bool, allow_mixed: bool = True) -> list[Point]:
    """The exported points under ``results``, in exp_name order; points measured differently (their
    receipts) are refused unless ``allow_mixed``."""
    skipped: list[str] = []
    found = find_cells(results, skipped)
    for line in skipped:
        print(f"export: {line}", file=sys.stderr)
    if not found:
        raise InputError(f"{results}: no cell result directories found (looked for cell.json, status.txt...)")
    wanted = WITH_INVALID if include_invalid else POINTS
    loaded = [(cell_dir, load_cell(cell_dir)) for cell_dir in sorted(found, key=lambda c: c.exp_name)]
    mixed = mixed_in_sweep(to_frame([row for _, row in loaded if row.status in wanted]), CELL_COLUMNS)
    if not allow_mixed:
        refuse_mixed(mixed, str(results))
    for line in mixed:
        print(f"export: allowed (--allow-mixed): {line}", file=sys.stderr)
    out: list[Point] = []
    for cell_dir, row in loaded:
        if row.status not in wanted:
            print(f"export: {row.exp_name}: {row.status}, not exported", file=sys.stderr)
            continue
        record = read_cell_record(cell_dir.path)
        try:
            cell = record.parse_cell() if record is not None else None
        except ResultFileError:
            cell = None
        if record is None or cell is None:
            print(
                f"export: {row.exp_name}: {row.status} with no readable cell, not exported", file=sys.stderr
            )
            continue
        out.append(Point(row.exp_name, cast(Outcome, row.status), cell, row.values, record.versions))
    return out


def rows(found: list[Point], shape: Shape) -> list[dict[str, Any]]:
    """The rows as JSON values, each checked against its shipped schema."""
    out: list[dict[str, Any]] = []
    for point in found:
        model = flat_row(point) if shape == "flat" else nested_row(point)
        row = model.model_dump(mode="json", by_alias=True)
        bad = problems(row, shape)
        if bad:
            raise ExportError(f"{point.exp_name}: the {shape} row breaks its schema: {'; '.join(bad[:5])}")
        out.append(row)
    return out


def run(args: argparse.Namespace) -> int:
    shape = cast(Shape, args.shape)
    target: Path = args.output
    check_target(target, "-o")  # before the work: a FIFO or device there is refused, never replaced
    exported = rows(points(args.results, args.include_invalid, args.allow_mixed), shape)
    write_text(target, json.dumps(exported, indent=1, allow_nan=False) + "\n", "-o")
    print(f"export: {len(exported)} {shape} rows -> {target}", file=sys.stderr)
    return 0
