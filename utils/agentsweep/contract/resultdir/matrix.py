"""The matrix JSON (`agentsweep matrix --json`): ``{"include": [cell, ...]}``, GitHub's matrix shape.

Collect reads it beside the result directories to list the cells that never left one; the workflow
and the experimental clients read it to know the cells. Each cell is parsed into the typed ``Cell``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kv_cache_tester.inputfiles import InputFileProblem, read_limited

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir.files import MATRIX_MAX_BYTES
from agentsweep.errors import InputError


def matrix_json(cells: Sequence[Cell], indent: int | None = None) -> str:
    """The matrix as GitHub takes it (compact unless ``indent``)."""
    separators = None if indent else (",", ":")
    return json.dumps(
        {"include": [c.model_dump(mode="json") for c in cells]}, indent=indent, separators=separators
    )


def read_matrix(path: Path) -> list[Cell]:
    """The cells of a matrix file: ``{"include": [...]}`` or a bare list of cells.

    InputError naming ``path`` when it cannot be read (not a regular file, over MATRIX_MAX_BYTES),
    is not JSON, is not a list of cells, names a cell twice (exp_name, case ignored) or holds a cell
    that is not valid (``<path>: include[<i>].<field>: <what>``).
    """
    return [
        Cell.parse(cell, where=f"{path}: include[{i}]") for i, cell in enumerate(read_matrix_entries(path))
    ]


def read_matrix_entries(path: Path, keyed_on: Sequence[tuple[str, type]] = ()) -> list[dict[str, Any]]:
    """The matrix file's cells as JSON objects, not yet parsed into ``Cell``: for a reader that checks
    what it is keyed on before the whole cell (``agentsweep cell-jobs``: the runner first).

    The same errors as ``read_matrix`` but for a cell's own fields; the fields of ``keyed_on`` (name,
    type) are checked in every cell: ``<path>: include[<i>].<field>: missing or not <type>``.
    """
    try:
        data = json.loads(read_limited(path, MATRIX_MAX_BYTES))
    except InputFileProblem as err:
        raise InputError(f"{path}: cannot read the matrix JSON ({err})") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read the matrix JSON ({err.strerror or err})") from None
    except (ValueError, RecursionError) as err:
        raise InputError(f"{path}: cannot read the matrix JSON (not JSON: {err})") from None
    cells = data.get("include") if isinstance(data, dict) else data
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise InputError(f"{path}: expected a list of cells or an object with an 'include' list")
    seen: dict[str, int] = {}
    for i, cell in enumerate(cells):
        name = cell.get("exp_name")
        if not isinstance(name, str) or not name:
            raise InputError(f"{path}: cell {i} has no exp_name")
        first = seen.setdefault(name.lower(), i)
        if first != i:
            raise InputError(
                f"{path}: cells {first} and {i} share the exp_name {name!r} (case ignored); "
                "a matrix names each cell once"
            )
    for i, cell in enumerate(cells):
        for field, kind in keyed_on:
            if not isinstance(cell.get(field), kind):
                raise InputError(f"{path}: include[{i}].{field}: missing or not {kind.__name__}")
    return cells
