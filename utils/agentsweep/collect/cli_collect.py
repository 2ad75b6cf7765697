"""`agentsweep collect ARTIFACTS_DIR OUT_DIR [--matrix MATRIX_JSON]` (or `-o OUT_DIR`).

Writes summary.csv, frontier.csv, capacity.csv (the capacity under SLO per tier: capacity cells'
searches and the grid-derived capacity of ordinary series), the PNG plots, report.html and summary.md
into OUT_DIR (and appends summary.md to $GITHUB_STEP_SUMMARY when that is set). Exit 0 when every cell
succeeded, 1 when any cell is FAILED, MALFORMED or MISSING, 3 when the only problems are INVALID cells
(a capacity cell's steps do not count: its own verdict does), 2 on bad arguments, on points measured
differently (replayer versions, or one curve's recipes, from the receipts) unless --allow-mixed, or on
an output that cannot be written (then none of the outputs is left).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from agentsweep.collect.aggregate import CELL_COLUMNS, build_rows, to_frame
from agentsweep.collect.capacity import CapacityResults, capacity_results
from agentsweep.collect.capacity_plots import write_capacity_plots
from agentsweep.collect.discover import find_cells
from agentsweep.collect.output import one_set, write_csv, write_text
from agentsweep.collect.pareto import frontier_table
from agentsweep.collect.plots import PLOT_FILES, write_plots
from agentsweep.collect.provenance import mixed_in_sweep, refuse_mixed
from agentsweep.collect.report import summary_markdown, sweep_headline, write_report
from agentsweep.config import overrides
from agentsweep.contract.resultdir import read_matrix
from agentsweep.contract.verdict import INVALID_EXIT
from agentsweep.errors import InputError, WriteError

FIGURES = (*PLOT_FILES, "capacity_*.png")
OUTPUTS = ("summary.csv", "frontier.csv", "capacity.csv", "summary.md", "report.html", *FIGURES)
"""Collect's outputs, one set: a disk that fills while they are written leaves none of them."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "artifacts", type=Path, help="folder of cell result dirs (download-artifact or results/<key>)"
    )
    add_out_dir(parser, "output folder (e.g. results/<key>/aggregated)")
    parser.add_argument(
        "--matrix", type=Path, default=None, help="`agentsweep matrix --json` output: expected cells"
    )
    parser.add_argument(
        "--no-plots",
        action="store_true",
        help="draw no figures: report.html keeps the headline and every table (seconds, not minutes, on a "
        "large sweep)",
    )
    parser.add_argument(
        "--allow-mixed",
        action="store_true",
        help="collect points of different replayer versions, or one curve's points of different recipes "
        "(refused by default, naming what differs)",
    )
    parser.add_argument(
        "--include-invalid",
        action="store_true",
        help="let INVALID cells onto the frontiers and plots (they stay INVALID in the table)",
    )
    parser.add_argument(
        "--slo",
        action="append",
        metavar="'NAME: C, C'",
        help="an SLO tier to read the grid-derived capacity against, e.g. 'interactive: ttft p90 <= 10 s, "
        "speed p25 >= 20 tok/s' (repeatable; default: the capacity cells' tiers, else the default tiers)",
    )


def add_out_dir(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The output folder, given as the last positional argument or as ``-o/--output`` (the one
    spelling every writing command takes); ``out_dir_of`` reads it."""
    parser.add_argument("out_dir", type=Path, nargs="?", default=None, help=f"{help_text}; or -o DIR")
    parser.add_argument("-o", "--output", type=Path, default=None, metavar="DIR", help=help_text)


def out_dir_of(args: argparse.Namespace) -> Path:
    """The output folder of ``add_out_dir``; one line and exit 2 when it is missing or given twice."""
    if args.out_dir is not None and args.output is not None and args.out_dir != args.output:
        raise InputError(f"two output folders: {args.out_dir} and -o {args.output}; give one")
    found: Path | None = args.output or args.out_dir
    if found is None:
        raise InputError("no output folder: give OUT_DIR or -o DIR")
    return found


def prepare_out_dir(path: Path) -> Path:
    """Create the output folder; a path that cannot be one is bad input (one line, exit 2)."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a parent is a file
        raise InputError(f"{path}: cannot create: a parent is not a directory") from None
    except OSError as err:
        raise InputError(f"{path}: cannot create: {err.strerror or err}") from None
    return path


def append_step_summary(text: str) -> None:
    """Append to $GITHUB_STEP_SUMMARY when it is set; a path that cannot be written is bad input."""
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not step_summary:
        return
    try:
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as err:
        raise InputError(
            f"$GITHUB_STEP_SUMMARY ({step_summary}): cannot append: {err.strerror or err}"
        ) from None


def remove_figures(out_dir: Path) -> None:
    """An earlier collect's figures in ``out_dir``: gone, so that the folder holds one set (a table of
    today beside a figure of yesterday would read as one)."""
    for pattern in FIGURES:
        for path in out_dir.glob(pattern):
            try:
                path.unlink(missing_ok=True)
            except OSError as err:
                raise WriteError(path, err) from None


def render_outputs(
    df: pd.DataFrame,
    out_dir: Path,
    plots: bool = True,
    include_invalid: bool = False,
    capacity: CapacityResults | None = None,
    mixed: Sequence[str] = (),
) -> pd.DataFrame:
    """frontier.csv, capacity.csv (when ``capacity`` is given), plots, report.html and summary.md from a
    summary table; returns the frontier. ``mixed``: how the points' provenance differs (allowed with
    --allow-mixed), said in summary.md."""
    frontier = frontier_table(df, include_invalid)
    write_csv(frontier, out_dir / "frontier.csv")
    if capacity is not None:
        write_csv(capacity.table, out_dir / "capacity.csv")
    head = sweep_headline(df, capacity)
    figures: list[tuple[str, Path]] = []
    if plots:
        figures = write_plots(df, out_dir, include_invalid)
        if capacity is not None:
            figures += write_capacity_plots(capacity.cells, out_dir)
    else:
        remove_figures(out_dir)
    write_report(df, figures, out_dir, capacity, head, drawn=plots)
    text = summary_markdown(df, frontier, capacity, head)
    if mixed:
        text += "\n### Points measured differently (--allow-mixed)\n\n" + "".join(f"- {m}\n" for m in mixed)
    write_text(out_dir / "summary.md", text)
    return frontier


def run(args: argparse.Namespace) -> int:
    args.out_dir = out_dir_of(args)
    matrix = read_matrix(args.matrix) if args.matrix else None
    skipped: list[str] = []
    found = find_cells(args.artifacts, skipped)
    for line in skipped:
        print(f"collect: {line}", file=sys.stderr)
    if not found and not matrix:
        raise InputError(
            f"{args.artifacts}: no cell result directories found (looked for cell.json, status.txt...)"
        )
    rows = build_rows(found, matrix)
    df = to_frame(rows)
    mixed = mixed_in_sweep(df, CELL_COLUMNS)
    if not args.allow_mixed:
        refuse_mixed(mixed, str(args.artifacts))
    for line in mixed:
        print(f"collect: allowed (--allow-mixed): {line}", file=sys.stderr)
    prepare_out_dir(args.out_dir)
    held = {r.result_dir: r.result for r in rows if r.result is not None and r.result_dir is not None}
    capacity = capacity_results(df, overrides.slo_tiers(args.slo), held)
    for note in capacity.notes:
        print(f"collect: capacity: {note}", file=sys.stderr)
    with one_set(args.out_dir, OUTPUTS):
        write_csv(df, args.out_dir / "summary.csv")
        render_outputs(
            df,
            args.out_dir,
            plots=not args.no_plots,
            include_invalid=args.include_invalid,
            capacity=capacity,
            mixed=mixed,
        )
    append_step_summary((args.out_dir / "summary.md").read_text(encoding="utf-8"))
    for line in capacity.lines:
        print(f"collect: {line}", file=sys.stderr)

    # A capacity cell's steps are its measurements: one past the boundary is INVALID by design; the
    # capacity cell itself stands for them.
    bad = [r for r in rows if r.status != "SUCCESS" and not r.step_of]
    cells = [r for r in rows if not r.step_of]
    steps = f" (and {len(rows) - len(cells)} capacity steps)" if len(cells) < len(rows) else ""
    print(
        f"collect: {len(cells)} cells{steps}, {len(cells) - len(bad)} SUCCESS -> {args.out_dir}",
        file=sys.stderr,
    )
    for row in bad:
        print(f"collect: {row.exp_name}: {row.status}: {row.reason}", file=sys.stderr)
    if not bad:
        return 0
    return INVALID_EXIT if all(r.status == "INVALID" for r in bad) else 1
