"""Run a plan's capacity searches, one after another in this process, each into its own result
directory (a complete capacity cell: ``agentsweep results ingest`` and ``collect`` read it).

A search whose directory already holds a finished capacity.json is kept, not run again: a plan
interrupted (SIGINT/SIGTERM) and started again with the same command finishes the rest.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from agentsweep.capacity.run import run_capacity_cell
from agentsweep.cell.plan import CellOptions, plan_cell
from agentsweep.cell.port_allocation import FreePortAllocator
from agentsweep.cell.stop import CellInterrupted, install_signal_handlers, interrupted_by
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import read_capacity, read_status


def finished(result_dir: Path) -> bool:
    """A search that ran to its end (SUCCESS, with its capacity.json)."""
    status = read_status(result_dir)
    return status is not None and status.verdict == "SUCCESS" and read_capacity(result_dir) is not None


class PlanInterrupted(Exception):
    """A stop signal ended a search (its verdict written); the plan runs no further search."""


def run_searches(cells: list[Cell], root: Path, say: Callable[[str], None]) -> list[str]:
    """Run every cell's search not finished yet under ``root/<exp_name>``; returns the exp_names it
    ran. A stop signal ends the running search with its verdict and capacity.json written (between
    two searches: at once; later signals are ignored), then raises PlanInterrupted."""
    ran: list[str] = []
    start = time.monotonic()
    restore = install_signal_handlers()  # as for one cell: the running search writes its verdict
    try:
        for i, cell in enumerate(cells, 1):
            result_dir = root / cell.exp_name
            if finished(result_dir):
                say(f"[{i}/{len(cells)}] {cell.exp_name}: finished before, kept")
                continue
            if result_dir.exists():  # an interrupted search: it starts over
                shutil.rmtree(result_dir)
            say(
                f"[{i}/{len(cells)}] {cell.exp_name}: capacity search ({time.monotonic() - start:.0f} s so far)"
            )
            plan = plan_cell(cell, result_dir, ports=FreePortAllocator())
            status, reason = run_capacity_cell(plan, CellOptions(), log=lambda line: None)
            say(f"[{i}/{len(cells)}] {cell.exp_name}: {status}" + (f": {reason}" if reason else ""))
            ran.append(cell.exp_name)
            if interrupted_by(reason) is not None:
                raise PlanInterrupted(reason)
    except CellInterrupted as err:  # between two searches, or as a search wrote its verdict
        raise PlanInterrupted(str(err)) from None
    finally:
        restore()
    return ran
