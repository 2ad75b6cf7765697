"""`agentsweep collect ARTIFACTS_DIR OUT_DIR [--matrix MATRIX_JSON]`.

Writes summary.csv, frontier.csv, the PNG plots, report.html and summary.md into OUT_DIR (and
appends summary.md to $GITHUB_STEP_SUMMARY when that is set). Exit 0 when every cell succeeded,
1 when any cell is FAILED, MALFORMED or MISSING, 3 when the only problems are INVALID cells, 2 on bad
arguments, on points measured differently (replayer versions, or one curve's recipes, from the
receipts) unless --allow-mixed, or on an output that cannot be written (then none of the outputs is
left).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from agentsweep.collect.aggregate import CELL_COLUMNS, build_rows, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.collect.output import one_set, write_csv, write_text
from agentsweep.collect.pareto import frontier_table
from agentsweep.collect.plots import PLOT_FILES, write_plots
from agentsweep.collect.provenance import mixed_in_sweep, refuse_mixed
from agentsweep.collect.report import summary_markdown, write_report
from agentsweep.contract.resultdir import read_matrix
from agentsweep.contract.verdict import INVALID_EXIT
from agentsweep.errors import InputError

OUTPUTS = ("summary.csv", "frontier.csv", "summary.md", "report.html", *PLOT_FILES)
"""Collect's outputs, one set: a disk that fills while they are written leaves none of them."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "artifacts", type=Path, help="folder of cell result dirs (download-artifact or results/<key>)"
    )
    parser.add_argument("out_dir", type=Path, help="output folder (e.g. results/<key>/aggregated)")
    parser.add_argument(
        "--matrix", type=Path, default=None, help="`agentsweep matrix --json` output: expected cells"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip PNGs and report.html (tables only)")
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


def render_outputs(
    df: pd.DataFrame,
    out_dir: Path,
    plots: bool = True,
    include_invalid: bool = False,
    mixed: Sequence[str] = (),
) -> pd.DataFrame:
    """frontier.csv, plots, report.html and summary.md from a summary table; returns the frontier.
    ``mixed``: how the points' provenance differs (allowed with --allow-mixed), said in summary.md."""
    frontier = frontier_table(df, include_invalid)
    write_csv(frontier, out_dir / "frontier.csv")
    if plots:
        write_report(df, write_plots(df, out_dir, include_invalid), out_dir)
    text = summary_markdown(df, frontier)
    if mixed:
        text += "\n### Points measured differently (--allow-mixed)\n\n" + "".join(f"- {m}\n" for m in mixed)
    write_text(out_dir / "summary.md", text)
    return frontier


def run(args: argparse.Namespace) -> int:
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
    with one_set(args.out_dir, OUTPUTS):
        write_csv(df, args.out_dir / "summary.csv")
        render_outputs(
            df, args.out_dir, plots=not args.no_plots, include_invalid=args.include_invalid, mixed=mixed
        )

    append_step_summary((args.out_dir / "summary.md").read_text(encoding="utf-8"))

    bad = [r for r in rows if r.status != "SUCCESS"]
    print(f"collect: {len(rows)} cells, {len(rows) - len(bad)} SUCCESS -> {args.out_dir}", file=sys.stderr)
    for row in bad:
        print(f"collect: {row.exp_name}: {row.status}: {row.reason}", file=sys.stderr)
    if not bad:
        return 0
    return INVALID_EXIT if all(r.status == "INVALID" for r in bad) else 1
