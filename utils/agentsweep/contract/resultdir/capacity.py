"""capacity.json: a capacity cell's answer per SLO tier (the boundary, agents per GPU, the binding
constraint).

Its typed model arrives with the capacity search that writes it; until then readers take it as one
JSON object, through here, bounded like every file read whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentsweep.contract.resultdir.fileio import read_json_object
from agentsweep.contract.resultdir.files import CAPACITY_JSON


def read_capacity(result_dir: Path) -> dict[str, Any] | None:
    """capacity.json of ``result_dir`` as an object, None when absent; ResultFileError when it is not
    a JSON object of at most its declared size."""
    found = read_json_object(result_dir, CAPACITY_JSON)
    return None if found is None else found[1]
