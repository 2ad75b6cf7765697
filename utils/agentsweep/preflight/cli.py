"""`agentsweep preflight`: check a config key's cells against the cluster before anything is allocated.

One line per check (PASS, FAIL with its fix, SKIP with why), then a summary line; ``--json`` prints
the same as one JSON object. Exit status 2 when any check FAILs, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agentsweep.contract.cell import CELL_ENV_VAR, Cell
from agentsweep.errors import ConfigError, InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--key", help="config key whose cells to check (default: the cell in $AGENTSWEEP_CELL)")
    what.add_argument("--cell", help="one matrix cell: its JSON, or @FILE")
    parser.add_argument(
        "--config", type=Path, default=None, help="sweep config (default configs/agentic.yaml)"
    )
    parser.add_argument(
        "--runners", type=Path, default=None, help="runners file (default $AGENTSWEEP_RUNNERS)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--no-probe", action="store_true", help="do not start the short Slurm job that checks the nodes"
    )
    parser.add_argument(
        "--probe-wait",
        type=int,
        default=60,
        metavar="S",
        help="seconds the node probe waits for free nodes before those checks are skipped (default 60)",
    )


def run(args: argparse.Namespace) -> int:
    from agentsweep.config import load_runners, select_cells
    from agentsweep.config.loader import repo_root
    from agentsweep.preflight.run import run_preflight

    runners = load_runners(args.runners)
    if args.key:
        cells = select_cells(args.config, [args.key], runners=runners, max_cells=None)
        subject = args.key
    else:
        raw = args.cell or os.environ.get(CELL_ENV_VAR, "")
        if not raw.strip():
            raise InputError(f"give --key KEY or --cell JSON (or set ${CELL_ENV_VAR})")
        cells = [Cell.load(raw, where="--cell" if args.cell else f"${CELL_ENV_VAR}")]
        subject = cells[0].exp_name
    if not cells:
        raise ConfigError(f"{args.key}: no cells")
    keys = sorted({c.runner for c in cells})
    if len(keys) != 1 or keys[0] not in runners:
        raise ConfigError(
            f"{subject}: cells on runner(s) {', '.join(keys)}; runners.yaml has {', '.join(sorted(runners))}"
        )
    report = run_preflight(
        subject,
        cells,
        keys[0],
        runners[keys[0]],
        environ=os.environ,
        repo=repo_root() or Path.cwd(),
        probe=not args.no_probe,
        probe_wait_s=args.probe_wait,
    )
    if args.json:
        print(report.to_json(), flush=True)
    else:
        print("\n".join(report.lines()), flush=True)
    return report.exit_code
