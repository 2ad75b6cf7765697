"""Find cell result directories under an artifacts or results tree, and the cells a matrix expects.

Layouts understood (ARCHITECTURE.md §3):
- GitHub download-artifact: ARTIFACTS/agentic_<exp_name>/<files> (sometimes one level deeper);
- local sweep: results/<config_key>/<exp_name>/<files> (``aggregated/`` folders are skipped).

A capacity cell's steps (``steps/<n>/``, each an ordinary result directory) are found through its
capacity.json and come right after it, marked with the capacity cell they belong to (``step_of``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agentsweep.contract.resultdir import (
    CAPACITY_JSON,
    CELL_JSON,
    REQUESTS_JSONL,
    SERVER_METRICS_CSV,
    STATUS_TXT,
    SUMMARY_JSON,
    read_capacity,
    read_cell_record,
)
from agentsweep.errors import InputError

# Any of these marks a directory as a cell result directory.
MARKERS = (CELL_JSON, STATUS_TXT, SUMMARY_JSON, REQUESTS_JSONL, SERVER_METRICS_CSV)
ARTIFACT_PREFIX = "agentic_"
MAX_DEPTH = 5


@dataclass(frozen=True)
class FoundCell:
    path: Path
    exp_name: str  # from cell.json when readable, else from the directory name
    step_of: str = ""  # a capacity cell's step: that cell's exp_name


def _name_from_dir(path: Path) -> str:
    name = path.name
    return name[len(ARTIFACT_PREFIX) :] if name.startswith(ARTIFACT_PREFIX) else name


def _exp_name(path: Path) -> str:
    """The name cell.json records, else the directory's (a broken cell.json is reported later)."""
    try:
        record = read_cell_record(path)
    except InputError:
        record = None
    return (record.exp_name if record else None) or _name_from_dir(path)


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
            cell = FoundCell(here, _exp_name(here))
            found.append(cell)
            if CAPACITY_JSON in filenames:
                found.extend(_steps(cell))
            dirnames[:] = []  # a cell's own sub-folders (debug dumps, steps) are not walked
        elif len(here.parts) - base_depth >= MAX_DEPTH:
            dirnames[:] = []
    return sorted(found, key=lambda c: _natural(str(c.path)))


def _natural(text: str) -> list[str | int]:
    """Sort key that puts steps/2 before steps/10 (the parts alternate text, number, text...)."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text))]


def _steps(cell: FoundCell) -> list[FoundCell]:
    """The steps capacity.json lists (a broken capacity.json is the capacity cell's row's problem)."""
    try:
        record = read_capacity(cell.path)
    except InputError:
        return []
    if record is None:
        return []
    return [
        FoundCell(cell.path / step.dir, _exp_name(cell.path / step.dir), cell.exp_name)
        for step in record.steps
        if not _leaves_through_a_link(cell.path, step.dir)
    ]


def _leaves_through_a_link(result_dir: Path, rel: str) -> bool:
    """True when a folder on the way from ``result_dir`` to ``rel`` is a link: a step is read only
    inside its capacity cell's directory."""
    here = result_dir
    for part in Path(rel).parts:
        here = here / part
        if here.is_symlink():
            return True
    return False
