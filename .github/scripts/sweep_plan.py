"""Resolve what the sweep's cell jobs need beyond the matrix cell fields.

Reads the matrix JSON (`agentsweep matrix --json`) and configs/runners.yaml, and appends to
$GITHUB_OUTPUT:
  runners=<{runner: {"runs_on": [labels], "launcher": "runners/launch_<runner>.sh"}}>  (used runners)
  timeouts=<{exp_name: minutes}>  job time limit per cell: the launcher's allocation time limit
                                   (replay duration + start-up and drain margins, as the launcher
                                   computes it) plus time to wait in the Slurm queue.
Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

# Minutes a cell may wait for its allocation before the job limit starts to bite.
QUEUE_MARGIN_MIN = 60


class PlanError(Exception):
    """Bad input: rendered as one line, exit status 2."""


def job_timeout_min(duration_s: int, engine: str, default_min: int) -> int:
    from agentsweep.cell.allocation import time_limit_min

    return time_limit_min(duration_s, engine, {}, default_min) + QUEUE_MARGIN_MIN


def load_cells(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise PlanError(f"{path}: cannot read the matrix JSON ({err})") from None
    cells = data.get("include") if isinstance(data, dict) else None
    if not isinstance(cells, list) or not cells:
        raise PlanError(f'{path}: expected {{"include": [cell, ...]}} with at least one cell')
    for i, cell in enumerate(cells):
        for field, kind in (("exp_name", str), ("runner", str), ("engine", str), ("duration", int)):
            if not isinstance(cell, dict) or not isinstance(cell.get(field), kind):
                raise PlanError(f"{path}: include[{i}].{field}: missing or not {kind.__name__}")
    return cells


def plan(cells: list[dict[str, Any]], runners_file: str | None) -> dict[str, str]:
    from agentsweep.config import load_runners  # the project's own validation of runners.yaml
    from agentsweep.contract.cell import Cell
    from agentsweep.errors import AgentsweepError, InputError

    try:
        specs = load_runners(runners_file)
    except AgentsweepError as err:
        raise PlanError(str(err)) from None
    runners: dict[str, dict[str, Any]] = {}
    timeouts: dict[str, int] = {}
    for i, cell in enumerate(cells):
        key = cell["runner"]
        if key not in specs:
            raise PlanError(f"cell {cell['exp_name']}: runner '{key}' is not in runners.yaml")
        try:  # the whole cell, as the cell job will read it
            Cell.parse(cell, where=f"include[{i}]")
        except InputError as err:
            raise PlanError(str(err)) from None
        spec = specs[key]
        runners[key] = {"runs_on": list(spec.runs_on), "launcher": spec.launcher}
        timeouts[cell["exp_name"]] = job_timeout_min(cell["duration"], cell["engine"], spec.time_limit_min)
    compact = {"separators": (",", ":"), "sort_keys": True}
    return {"runners": json.dumps(runners, **compact), "timeouts": json.dumps(timeouts, **compact)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", required=True, type=Path, help="agentsweep matrix --json output")
    parser.add_argument("--runners", default=None, help="runners.yaml (default: configs/runners.yaml)")
    args = parser.parse_args(argv)
    try:
        outputs = plan(load_cells(args.matrix), args.runners)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    target = os.environ.get("GITHUB_OUTPUT")
    lines = "".join(f"{name}={value}\n" for name, value in outputs.items())
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(lines)
    else:
        sys.stdout.write(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
