"""A cell's power figures as summary.csv columns (``columns.POWER``), from the one power summary
(``agentsweep.energy.power_summary``): collect defines none of them again. The window comes from the
summary.json collect read already (``CellResult.summary``); only power.csv is read here."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kv_cache_tester.replay import Summary

from agentsweep.contract.cell import Cell
from agentsweep.contract.columns import POWER
from agentsweep.energy.summary import cell_power_summary

FIGURES = tuple(
    c.name
    for c in POWER
    if c.name not in ("power_valid", "power_reasons", "power_reason_codes", "power_audit")
)


def power_columns(result_dir: Path, cell: Cell, summary: Summary) -> tuple[dict[str, Any], list[str]]:
    """(the POWER columns, notes) of a cell and its summary.json: a note says why the figures are
    withheld, for a cell that samples power."""
    power = cell_power_summary(result_dir, cell, summary)
    out: dict[str, Any] = {name: getattr(power, name) for name in FIGURES}
    out["power_valid"] = power.power_valid
    out["power_reasons"] = json.dumps(list(power.reasons))
    out["power_reason_codes"] = json.dumps(list(power.reason_codes))
    out["power_audit"] = json.dumps(asdict(power.audit), sort_keys=True, separators=(",", ":"))
    notes = []
    if not power.power_valid and cell.node.power_source != "none":
        notes.append(f"power figures withheld: {'; '.join(power.reasons)}")
    return out, notes
