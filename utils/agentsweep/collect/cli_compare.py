"""`agentsweep compare A B`: two collected sweeps (aggregated folders) side by side, B / A per cell.

Refused (exit 2, naming what differs) when A and B ran different replayer versions or a matched cell's
recipe differs (engine version, image, client version), unless --allow-mixed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentsweep.collect.cli_collect import prepare_out_dir
from agentsweep.collect.cli_pareto import read_summary
from agentsweep.collect.compare import AXES, checked, compare, markdown, md_text
from agentsweep.collect.output import one_set, write_csv, write_text
from agentsweep.collect.provenance import mixed_between, refuse_mixed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", type=Path, help="baseline: an aggregated folder or its summary.csv")
    parser.add_argument("b", type=Path, help="candidate: an aggregated folder or its summary.csv")
    parser.add_argument(
        "-o",
        "--output",
        "--out",
        dest="out",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder for compare.csv and compare.md (default: B's)",
    )
    parser.add_argument(
        "--allow-mixed",
        action="store_true",
        help="compare sweeps of different replayer versions, or matched cells of different recipes "
        "(refused by default, naming what differs; allowed, compare.md says it)",
    )
    parser.add_argument(
        "--on",
        default=None,
        help=f"comma-separated columns that match cells (default: every axis of a cell, {','.join(AXES)}; "
        "exp_name for same-key sweeps)",
    )


def run(args: argparse.Namespace) -> int:
    names = (f"A ({args.a})", f"B ({args.b})")
    keys = AXES if args.on is None else tuple(k.strip() for k in args.on.split(",") if k.strip())
    a, b = (
        checked(read_summary(path, literal=True), keys, name)
        for path, name in zip((args.a, args.b), names, strict=True)
    )
    table = compare(a, b, keys, names=names)
    mixed = mixed_between(a, b, keys, ("A", "B"))
    if not args.allow_mixed:
        refuse_mixed(mixed, f"{args.a} vs {args.b}")
    out = prepare_out_dir(args.out or (args.b if args.b.is_dir() else args.b.parent))
    text = markdown(table, str(args.a), str(args.b), keys)
    if mixed:
        text += "\n**Measured differently (--allow-mixed):**\n\n" + "".join(
            f"- {md_text(m)}\n" for m in mixed
        )
    # One set, each file whole or not at all: a stop part way never leaves one that looks complete.
    with one_set(out, ("compare.csv", "compare.md")):
        write_csv(table, out / "compare.csv")
        write_text(out / "compare.md", text)
    print(text)
    print(f"compare: wrote {out / 'compare.csv'} and {out / 'compare.md'}", file=sys.stderr)
    return 0
