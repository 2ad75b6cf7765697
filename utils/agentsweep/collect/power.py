"""A cell's power figures as summary.csv columns (``columns.POWER``), from the one power summary
(``agentsweep.energy.power_summary``): collect defines none of them again."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agentsweep.contract.cell import Cell
from agentsweep.contract.columns import POWER
from agentsweep.energy.summary import cell_power_summary

FIGURES = tuple(
    c.name
    for c in POWER
    if c.name not in ("power_valid", "power_reasons", "power_reason_codes", "power_audit")
)


def power_columns(result_dir: Path, cell: Cell) -> tuple[dict[str, Any], list[str]]:
    """(the POWER columns, notes): a note says why the figures are withheld, for a cell that samples power."""
    summary = cell_power_summary(result_dir, cell)
    out: dict[str, Any] = {name: getattr(summary, name) for name in FIGURES}
    out["power_valid"] = summary.power_valid
    out["power_reasons"] = json.dumps(list(summary.reasons))
    out["power_reason_codes"] = json.dumps(list(summary.reason_codes))
    out["power_audit"] = json.dumps(asdict(summary.audit), sort_keys=True, separators=(",", ":"))
    notes = []
    if not summary.power_valid and cell.power_source != "none":
        notes.append(f"power figures withheld: {'; '.join(summary.reasons)}")
    return out, notes
