"""A cell's power figures as summary.csv columns (``columns.POWER``), rendered from its one power
summary (``agentsweep.energy.cell_power_summary``): collect defines none of them again. The row keeps
the summary itself (``Row.power``) for a reader that wants its reasons and audit as values, not as
the columns' JSON text."""

from __future__ import annotations

import json
from dataclasses import asdict

from agentsweep.contract.cell import Cell
from agentsweep.contract.columns import POWER
from agentsweep.contract.figures import Figures
from agentsweep.energy.summary import PowerSummary

FIGURES = tuple(
    c.name
    for c in POWER
    if c.name not in ("power_valid", "power_reasons", "power_reason_codes", "power_audit")
)


def power_columns(power: PowerSummary, cell: Cell) -> tuple[Figures, list[str]]:
    """(the POWER columns, notes) of a cell's power summary: a note says why the figures are withheld,
    for a cell that samples power."""
    out: Figures = {name: getattr(power, name) for name in FIGURES}
    out["power_valid"] = power.power_valid
    out["power_reasons"] = json.dumps(list(power.reasons))
    out["power_reason_codes"] = json.dumps(list(power.reason_codes))
    out["power_audit"] = json.dumps(asdict(power.audit), sort_keys=True, separators=(",", ":"))
    notes = []
    if not power.power_valid and cell.node.power_source != "none":
        notes.append(f"power figures withheld: {'; '.join(power.reasons)}")
    return out, notes
