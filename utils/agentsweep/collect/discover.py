"""Find cell result directories under an artifacts or results tree, and the cells a matrix expects.

Layouts understood (ARCHITECTURE.md §3):
- GitHub download-artifact: ARTIFACTS/agentic_<exp_name>/<files> (sometimes one level deeper);
- local sweep: results/<config_key>/<exp_name>/<files> (``aggregated/`` folders are skipped).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentsweep.errors import InputError

# Any of these marks a directory as a cell result directory.
MARKERS = ("cell.json", "status.txt", "summary.json", "requests.jsonl", "server_metrics.csv")
ARTIFACT_PREFIX = "agentic_"
MAX_DEPTH = 5


@dataclass(frozen=True)
class FoundCell:
    path: Path
    exp_name: str  # from cell.json when readable, else from the directory name


def _name_from_dir(path: Path) -> str:
    name = path.name
    return name[len(ARTIFACT_PREFIX) :] if name.startswith(ARTIFACT_PREFIX) else name


def _exp_name(path: Path) -> str:
    try:
        data = json.loads((path / "cell.json").read_text(encoding="utf-8"))
        name = data["cell"]["exp_name"]
        if isinstance(name, str) and name:
            return name
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return _name_from_dir(path)


def find_cells(root: Path) -> list[FoundCell]:
    """Every cell result directory under ``root`` (root itself may be one), sorted by path."""
    if not root.is_dir():
        raise InputError(f"{root}: no such directory")
    found: list[FoundCell] = []
    base_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d != "aggregated" and not d.startswith("."))
        if any(m in filenames for m in MARKERS):
            found.append(FoundCell(here, _exp_name(here)))
            dirnames[:] = []  # a cell's own sub-folders (debug dumps) are not cells
        elif len(here.parts) - base_depth >= MAX_DEPTH:
            dirnames[:] = []
    return sorted(found, key=lambda c: str(c.path))


def load_matrix(path: Path) -> list[dict[str, Any]]:
    """Cells named by `agentsweep matrix --json`: a list, or an object with `include`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"{path}: cannot read matrix: {err.strerror or err}") from None
    except ValueError as err:
        raise InputError(f"{path}: not JSON: {err}") from None
    cells = data.get("include") if isinstance(data, dict) else data
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise InputError(f"{path}: expected a list of cells or an object with an 'include' list")
    for i, cell in enumerate(cells):
        if not isinstance(cell.get("exp_name"), str) or not cell["exp_name"]:
            raise InputError(f"{path}: cell {i} has no exp_name")
    return cells
