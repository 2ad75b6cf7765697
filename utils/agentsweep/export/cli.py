"""`agentsweep export --format inferencex DIR -o OUT [--shape flat|nested] [--include-invalid]
[--allow-unmapped] [--allow-mixed]`.

Writes OUT, a new directory laid out as an InferenceX run's artifacts (``export.artifacts``): one row
per SUCCESS point of the sweep under DIR (INVALID and FAILED cells only with --include-invalid, each
with its ``benchmark_outcome``; MALFORMED directories never: a directory that no longer matches its
receipt reads MALFORMED, as collect reads it), its raw sibling, and every row in one array. A capacity
cell's steps are points like any cell; the capacity cell itself is not a row (its figures are its
steps' and capacity.json's). Points of different replayer versions, one curve of different recipes,
or points without a receipt beside points with one, are refused (exit 2, naming what differs) unless
--allow-mixed, as in collect.

Before anything is written every row is checked against the shipped JSON Schema of its shape (a row
that breaks it is an error naming the cell and the field) and against what InferenceX's ingest needs
to place it (``export.inferencex``): a model key and a GPU it knows (else one line naming the field to
set, exit 2, unless --allow-unmapped), and no two rows one point there. Exit 0 on success, 2 on bad
input (no cells, an output that exists or cannot be written), and nothing is written then.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any, cast

from agentsweep.collect.aggregate import CELL_COLUMNS, load_cell, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.collect.provenance import mixed_in_sweep, refuse_mixed
from agentsweep.errors import AgentsweepError, InputError
from agentsweep.export.artifacts import write_layout
from agentsweep.export.build import Point, flat_row, nested_row
from agentsweep.export.inferencex import colliding, unmapped
from agentsweep.export.models import row_json
from agentsweep.export.schema import Shape, problems

POINTS = ("SUCCESS",)
WITH_INVALID = ("SUCCESS", "INVALID", "FAILED")


class ExportError(AgentsweepError):
    """A row breaks its shipped schema: a defect of the exporter, not of the input."""

    prefix = "export error"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, help="a sweep's result directories (results/<key>)")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="the directory to write (must not exist, or be empty)",
    )
    parser.add_argument("--format", choices=("inferencex",), default="inferencex", help="row format")
    parser.add_argument(
        "--shape",
        choices=("flat", "nested"),
        default="flat",
        help="flat: {stat}_{metric} keys; nested: request_metrics/server_metrics blocks (default flat)",
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
        help="also write INVALID and FAILED cells (benchmark_outcome status failed: kept out of curves)",
    )
    parser.add_argument(
        "--allow-unmapped",
        action="store_true",
        help="write rows whose model or hardware InferenceX does not know (its ingest skips them)",
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
    for _, row in loaded:
        if row.status not in wanted:
            print(f"export: {row.exp_name}: {row.status}, not exported", file=sys.stderr)
            continue
        if row.cell_fields.get("capacity"):
            steps = sum(1 for c, _ in loaded if c.step_of == row.exp_name)
            print(
                f"export: {row.exp_name}: a capacity cell, not a point itself: its {steps} steps are "
                "points of their own, its capacity is in its capacity.json",
                file=sys.stderr,
            )
            continue
        result = row.result
        cell = result.cell if result is not None else None
        if result is None or cell is None:
            print(
                f"export: {row.exp_name}: {row.status} with no readable cell, not exported", file=sys.stderr
            )
            continue
        out.append(
            Point(
                row,
                cell,
                result.record.versions,
                failed_by_class=result.failed_by_class,
                window=result.window,
                deviations=result.preset_deviations,
            )
        )
    return out


def rows(found: list[Point], shape: Shape, allow_unmapped: bool = False) -> list[dict[str, Any]]:
    """The rows as JSON values, each checked against its shipped schema and InferenceX's ingest."""
    out: list[dict[str, Any]] = []
    missing: list[str] = []
    for point in found:
        model = flat_row(point) if shape == "flat" else nested_row(point)
        row = row_json(model)
        bad = problems(row, shape)
        if bad:
            raise ExportError(f"{point.exp_name}: the {shape} row breaks its schema: {'; '.join(bad[:5])}")
        missing.extend(f"{point.exp_name}: {line}" for line in unmapped(row))
        out.append(row)
    if missing and not allow_unmapped:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise InputError(f"{missing[0]}{more}")
    clash = colliding(out)
    if clash:
        more = f" (and {len(clash) - 1} more)" if len(clash) > 1 else ""
        raise InputError(f"{clash[0]}{more}")
    return out


def _fresh(target: Path) -> None:
    """Refuse an output that is a file, a link, a non-empty directory, or named like a file."""
    if target.suffix == ".json":
        raise InputError(f"{target}: give a directory: the export writes InferenceX's artifact layout there")
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    except OSError as err:  # a name too long, a parent that is a file...
        raise InputError(f"{target}: cannot write: {(err.strerror or str(err)).lower()}") from None
    if not stat.S_ISDIR(mode):  # a file, a FIFO, a device or a link: refused, never replaced
        raise InputError(f"{target}: exists and is not a directory")
    if any(target.iterdir()):
        raise InputError(f"{target}: exists and is not empty")


def write(target: Path, exported: list[dict[str, Any]], found: list[Point]) -> None:
    """The layout into a temporary directory beside ``target``, then renamed to it: all or nothing."""
    _fresh(target)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        write_layout(staging, exported, found)
        if target.is_dir():
            target.rmdir()
        staging.rename(target)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise InputError(f"{target}: cannot write: {err.strerror or err}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def run(args: argparse.Namespace) -> int:
    shape = cast(Shape, args.shape)
    _fresh(args.output)
    found = points(args.results, args.include_invalid, args.allow_mixed)
    exported = rows(found, shape, args.allow_unmapped)
    write(args.output, exported, found)
    print(f"export: {len(exported)} {shape} rows -> {args.output}", file=sys.stderr)
    return 0
