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

from kv_cache_tester.inputfiles import InputFileProblem, read_limited

from agentsweep.errors import InputError

# Any of these marks a directory as a cell result directory.
MARKERS = ("cell.json", "status.txt", "summary.json", "requests.jsonl", "server_metrics.csv")
ARTIFACT_PREFIX = "agentic_"
MAX_DEPTH = 5
MAX_CELL_JSON_BYTES = 16 << 20
MAX_MATRIX_BYTES = 64 << 20


@dataclass(frozen=True)
class FoundCell:
    path: Path
    exp_name: str  # from cell.json when readable, else from the directory name


def _name_from_dir(path: Path) -> str:
    name = path.name
    return name[len(ARTIFACT_PREFIX) :] if name.startswith(ARTIFACT_PREFIX) else name


def _exp_name(path: Path) -> str:
    try:
        data = json.loads(read_limited(path / "cell.json", MAX_CELL_JSON_BYTES))
        name = data["cell"]["exp_name"]
        if isinstance(name, str) and name:
            return name
    except (OSError, ValueError, KeyError, TypeError):  # InputFileProblem is a ValueError
        pass
    return _name_from_dir(path)


def find_cells(root: Path, skipped: list[str] | None = None) -> list[FoundCell]:
    """Every cell result directory under ``root`` (root itself may be one), sorted by path.

    A linked directory is followed when it leads to a place inside ``root``; one leading outside
    is not, and a line saying so goes to ``skipped``.
    """
    if not root.is_dir():
        raise InputError(f"{root}: no such directory")
    found: list[FoundCell] = []
    base_depth = len(root.parts)
    inside = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d != "aggregated" and not d.startswith("."))
        for name in list(dirnames):
            target = (here / name).resolve()
            if (here / name).is_symlink() and (target == inside or inside not in target.parents):
                dirnames.remove(name)
                if skipped is not None:
                    skipped.append(f"{here / name}: a link to {target}, outside {root}; not followed")
        if any(m in filenames for m in MARKERS):
            found.append(FoundCell(here, _exp_name(here)))
            dirnames[:] = []  # a cell's own sub-folders (debug dumps) are not cells
        elif len(here.parts) - base_depth >= MAX_DEPTH:
            dirnames[:] = []
    return sorted(found, key=lambda c: str(c.path))


def load_matrix(path: Path) -> list[dict[str, Any]]:
    """Cells named by `agentsweep matrix --json`: a list, or an object with `include`."""
    try:
        data = json.loads(read_limited(path, MAX_MATRIX_BYTES))
    except InputFileProblem as err:
        raise InputError(f"{path}: cannot read matrix: {err}") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read matrix: {err.strerror or err}") from None
    except ValueError as err:
        raise InputError(f"{path}: not JSON: {err}") from None
    cells = data.get("include") if isinstance(data, dict) else data
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise InputError(f"{path}: expected a list of cells or an object with an 'include' list")
    seen: dict[str, int] = {}
    for i, cell in enumerate(cells):
        if not isinstance(cell.get("exp_name"), str) or not cell["exp_name"]:
            raise InputError(f"{path}: cell {i} has no exp_name")
        first = seen.setdefault(cell["exp_name"].lower(), i)
        if first != i:
            raise InputError(
                f"{path}: cells {first} and {i} share the exp_name {cell['exp_name']!r} (case ignored); "
                "a matrix names each cell once"
            )
    return cells
