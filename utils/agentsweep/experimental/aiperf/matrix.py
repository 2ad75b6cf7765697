"""Run matrix cells locally with the AIPerf client through the cell runner's own plan and lifecycle.

Until the cell runner dispatches on ``client`` itself, this swaps the replayer argv of
``agentsweep.cell.plan.plan_cell`` for :func:`aiperf_command`'s; everything else (engine, health
wait, scraper, cell.json with ``client: aiperf``, status.txt) is the cell runner's.
"""

from __future__ import annotations

from pathlib import Path

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import STATUS_TXT
from agentsweep.errors import InputError


def run_cells(cells: list[Cell], results: Path, *, health_timeout: float | None = None) -> int:
    """Run each cell (as read by ``agentsweep.contract.resultdir.read_matrix``) into
    ``results/<exp_name>``; returns the number of FAILED cells."""
    from agentsweep.cell.lifecycle import run_cell
    from agentsweep.cell.plan import CellOptions, plan_cell
    from agentsweep.cell.port_allocation import FreePortAllocator

    failed = 0
    for cell in cells:
        spec = cell.replace(client="aiperf")
        result_dir = results / spec.exp_name
        if (result_dir / STATUS_TXT).exists():
            raise InputError(f"{result_dir}: already holds a cell result; use an empty results folder")
        # The cell's client is aiperf, so the plan's load command is aiperf_command's.
        plan = plan_cell(spec, result_dir, ports=FreePortAllocator())
        status, _ = run_cell(plan, CellOptions(health_timeout_s=health_timeout))
        failed += status != "SUCCESS"
    return failed
