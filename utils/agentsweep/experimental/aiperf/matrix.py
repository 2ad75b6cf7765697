"""Run matrix cells locally with the AIPerf client through the cell runner's own plan and lifecycle.

Until the cell runner dispatches on ``client`` itself, this swaps the replayer argv of
``agentsweep.cell.plan.plan_cell`` for :func:`aiperf_command`'s; everything else (engine, health
wait, scraper, cell.json with ``client: aiperf``, status.txt) is the cell runner's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentsweep.errors import InputError


def read_matrix(path: Path) -> list[dict[str, Any]]:
    """Cells of ``agentsweep matrix --json`` output (``{"include": [...]}``) or a list of cells."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"{path}: cannot read: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: bad JSON at line {err.lineno}: {err.msg}") from None
    cells = data.get("include") if isinstance(data, dict) else data
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise InputError(f'{path}: expected {{"include": [cell, ...]}} (agentsweep matrix --json)')
    return cells


def run_cells(cells: list[dict[str, Any]], results: Path, *, health_timeout: float | None = None) -> int:
    """Run each cell into ``results/<exp_name>``; returns the number of FAILED cells."""
    from agentsweep.cell.lifecycle import run_cell
    from agentsweep.cell.placement import free_port
    from agentsweep.cell.plan import CellOptions, plan_cell
    from agentsweep.contract.cell import Cell

    failed = 0
    for i, raw in enumerate(cells):
        spec = Cell.parse({**raw, "client": "aiperf"}, where=f"include[{i}]")
        result_dir = results / spec.exp_name
        if (result_dir / "status.txt").exists():
            raise InputError(f"{result_dir}: already holds a cell result; use an empty results folder")
        # The cell's client is aiperf, so the plan's load command is aiperf_command's.
        plan = plan_cell(spec, result_dir, port=free_port())
        status, _ = run_cell(plan, CellOptions(health_timeout_s=health_timeout))
        failed += status != "SUCCESS"
    return failed
