"""`agentsweep cell-jobs`: what the sweep workflow's cell jobs need beyond the matrix cells.

Reads the matrix JSON (`agentsweep matrix --json`) and the runners' site settings (configs/runners.yaml
or $AGENTSWEEP_RUNNERS), and appends to $GITHUB_OUTPUT (stdout when it is not set):

  runners=<{runner: {"runs_on": [labels], "launcher": "runners/launch_<runner>.sh"}}>  (runners used)
  timeouts=<{exp_name: minutes}>  each cell job's time limit: the launcher's allocation time limit
                                  (replay duration + start-up and drain margins, as the launcher
                                  computes it; a capacity cell's job time limit) plus time to wait
                                  in the Slurm queue.

Everything a cell needs of its runner's nodes is already in the cell (the matrix resolved it); the
runner's GitHub labels, launcher and default time limit are what is looked up here. Bad input is one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentsweep.cell.allocation import cell_time_limit_min
from agentsweep.config.schema import RunnerSpec
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import read_matrix_entries
from agentsweep.errors import ConfigError, InputError

# Minutes a cell may wait for its allocation before the job limit starts to bite.
QUEUE_MARGIN_MIN = 60
# The fields a cell's job is keyed on, checked before the whole cell is, so that a matrix from another
# tool fails on what matters.
KEYED_ON: tuple[tuple[str, type], ...] = (
    ("exp_name", str),
    ("runner", str),
    ("engine", str),
    ("duration", int),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", required=True, type=Path, help="`agentsweep matrix --json` output")
    parser.add_argument(
        "--runners",
        default=None,
        help="runners file (default: $AGENTSWEEP_RUNNERS, else configs/runners.yaml)",
    )


def run(args: argparse.Namespace) -> int:
    from agentsweep.config import load_runners

    cells = read_matrix_entries(args.matrix, keyed_on=KEYED_ON)
    if not cells:
        raise InputError(f'{args.matrix}: expected {{"include": [cell, ...]}} with at least one cell')
    outputs = cell_jobs(cells, load_runners(args.runners))
    lines = "".join(f"{name}={value}\n" for name, value in outputs.items())
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(lines)
    else:
        sys.stdout.write(lines)
    return 0


def job_timeout_min(cell: Cell, default_min: int) -> int:
    """A cell job's time limit: the allocation's (as the launcher computes it) plus the queue margin."""
    return cell_time_limit_min(cell, {}, default_min) + QUEUE_MARGIN_MIN


def cell_jobs(cells: Sequence[Mapping[str, Any]], runners: Mapping[str, RunnerSpec]) -> dict[str, str]:
    """The GitHub outputs ``runners`` and ``timeouts`` (compact JSON) for ``cells`` (matrix entries)."""
    used: dict[str, dict[str, Any]] = {}
    timeouts: dict[str, int] = {}
    for i, raw in enumerate(cells):
        key = raw["runner"]
        spec = runners.get(key)
        if spec is None:
            raise ConfigError(f"cell {raw['exp_name']}: runner '{key}' is not in runners.yaml")
        cell = Cell.parse(dict(raw), where=f"include[{i}]")  # the whole cell, as its job will read it
        used[key] = {"runs_on": list(spec.runs_on), "launcher": spec.launcher}
        timeouts[cell.exp_name] = job_timeout_min(cell, spec.time_limit_min)
    return {"runners": _compact(used), "timeouts": _compact(timeouts)}


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)
