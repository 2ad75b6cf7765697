"""Load clients: what drives the engine for a cell, as plug-ins.

A client is a small object (:class:`LoadClient`) in a module of its own; ``CLIENTS`` maps each client
name of the cell contract to that module, imported only when a cell uses it, so the core never imports
an experimental client. Whatever the client, it must leave requests.jsonl and summary.json in the
result directory (ARCHITECTURE.md §4-5).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol

from agentsweep.cell.engines import EngineRecipe
from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError

# client name (every name of agentsweep.contract.cell.Client) -> module whose CLIENT drives the load
CLIENTS: dict[str, str] = {
    "replay": "agentsweep.cell.clients.replay",
    "aiperf": "agentsweep.experimental.aiperf.client",
}


class LoadClient(Protocol):
    def command(
        self, cell: Cell, *, engine: EngineRecipe, endpoint: str, output_dir: Path, python: str
    ) -> list[str]:
        """argv of the client process for ``cell`` against ``endpoint`` (``http://HOST:PORT``)."""
        ...

    def version(self) -> str | None:
        """The client's version, for the cell's receipt (None when it cannot be told)."""
        ...


def client(name: str) -> LoadClient:
    """The registered client ``name`` (imported on first use)."""
    module_path = CLIENTS.get(name)
    if module_path is None:
        raise InputError(f"cell.client: no load client {name!r} (known: {', '.join(CLIENTS)})")
    found: LoadClient = importlib.import_module(module_path).CLIENT
    return found
