"""AIPerf as a load client of the cell (registered by module path in agentsweep.cell.clients)."""

from __future__ import annotations

from pathlib import Path

from agentsweep.cell.engines import EngineRecipe
from agentsweep.contract.cell import Cell
from agentsweep.experimental.aiperf.cell import aiperf_command
from agentsweep.experimental.aiperf.venv import AIPERF_VERSION


class AiperfClient:
    def command(
        self, cell: Cell, *, engine: EngineRecipe, endpoint: str, output_dir: Path, python: str
    ) -> list[str]:
        return aiperf_command(cell, endpoint=endpoint, output_dir=output_dir, python=python)

    def version(self) -> str | None:
        return AIPERF_VERSION


CLIENT = AiperfClient()
