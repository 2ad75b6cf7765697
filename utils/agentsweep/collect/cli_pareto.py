"""`agentsweep pareto SUMMARY_CSV OUT_DIR`: frontier.csv, plots and report from a summary.csv."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from agentsweep.collect.cli_collect import OUTPUTS, add_out_dir, out_dir_of, prepare_out_dir, render_outputs
from agentsweep.collect.output import one_set
from agentsweep.errors import InputError

REQUIRED = ("exp_name", "status")


def read_summary(path: Path, *, literal: bool = False) -> pd.DataFrame:
    """A summary.csv written by `agentsweep collect`; InputError when it is not one. ``literal``: only
    an empty field is missing (collect writes nothing else for one), so a "nan" or "NA" written in by
    hand stays text for the caller's checks to refuse."""
    if path.is_dir():
        path = path / "summary.csv"
    if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
        raise InputError(f"{path}: not a regular file")
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=[""]) if literal else pd.read_csv(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory without a summary.csv") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    except ValueError as err:  # pandas ParserError, EmptyDataError and UnicodeDecodeError are ValueErrors
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise InputError(f"{path}: not a readable CSV ({first})") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(f"{path}: not a summary.csv (missing columns {', '.join(missing)})")
    if df.empty:  # collect always writes a row per cell: an empty table is not one of its outputs
        raise InputError(f"{path}: summary.csv has no cell rows")
    return df


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("summary", type=Path, help="summary.csv (or the folder holding it)")
    add_out_dir(parser, "output folder")
    parser.add_argument(
        "--no-plots",
        action="store_true",
        help="draw no figures: frontier.csv, summary.md and report.html (its tables)",
    )


def run(args: argparse.Namespace) -> int:
    args.out_dir = out_dir_of(args)
    df = read_summary(args.summary)
    prepare_out_dir(args.out_dir)
    with one_set(args.out_dir, [name for name in OUTPUTS if name != "summary.csv"]):  # its input stays
        frontier = render_outputs(df, args.out_dir, plots=not args.no_plots)
    print(f"pareto: {len(frontier)} frontier points -> {args.out_dir / 'frontier.csv'}", file=sys.stderr)
    return 0
