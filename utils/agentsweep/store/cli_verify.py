"""`agentsweep verify DIR...`: recompute each result directory's receipt and name every difference.

DIR is a cell result directory or a folder of them (a collected sweep). Prints one line per changed,
missing or extra file and per non-finite number; exit 0 when everything matches, 2 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentsweep.collect.discover import find_cells
from agentsweep.contract.receipt import RECEIPT_FILE, ReceiptError, verify
from agentsweep.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dirs", nargs="+", type=Path, metavar="DIR", help="result directory or a folder of them"
    )


def run(args: argparse.Namespace) -> int:
    bad = 0
    checked = 0
    for root in args.dirs:
        if not root.is_dir():
            raise InputError(f"{root}: no such directory")
        # collect's discovery alone: the store's readers import pandas (1.5 s) that checking hashes needs not
        dirs = [root] if (root / RECEIPT_FILE).exists() else [cell.path for cell in find_cells(root, [])]
        if not dirs:
            raise InputError(f"{root}: no result directories found")
        for path in dirs:
            checked += 1
            try:
                problems = verify(path)
            except ReceiptError as err:
                print(f"verify: {err}", file=sys.stderr)
                bad += 1
                continue
            for problem in problems:
                print(f"verify: {problem.line(path)}", file=sys.stderr)
            bad += bool(problems)
    if bad:
        print(f"verify: {bad} of {checked} result directories do not match their receipt", file=sys.stderr)
        return 2
    print(f"verify: {checked} result directories match their receipts", file=sys.stderr)
    return 0
