"""Show a list of cells: a terminal table, the GitHub matrix JSON, a markdown job summary."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import matrix_json
from agentsweep.errors import InputError

# Columns of the human table and the markdown summary (the JSON always has every field).
TABLE_COLUMNS: tuple[str, ...] = (
    "exp_name",
    "runner",
    "engine",
    "model",
    "tp",
    "ep",
    "users",
    "offload",
    "cpu_dram_gb",
    "duration",
)
# Shown after offload when any cell is a scale-out cell (replicas behind a router).
SCALEOUT_COLUMNS: tuple[str, ...] = ("replicas", "router", "gpus")


def _columns(cells: Sequence[Cell]) -> tuple[str, ...]:
    if not any(c.routed or c.replicas > 1 for c in cells):
        return TABLE_COLUMNS
    at = TABLE_COLUMNS.index("offload") + 1
    extra = SCALEOUT_COLUMNS
    if any(c.disaggregated for c in cells):
        extra += ("prefill", "decode")
    if any(c.nodes > 1 for c in cells):
        extra += ("nodes",)
    return TABLE_COLUMNS[:at] + extra + TABLE_COLUMNS[at:]


def _cell_text(cell: Cell, column: str) -> str:
    value = getattr(cell, column)
    if column == "users" and cell.capacity is not None:  # a capacity cell searches its users
        return f"{cell.capacity.low}..{cell.capacity.high}"
    if column == "cpu_dram_gb":
        return f"{value:g}" if value else "-"
    if column == "router":
        return str(value) or "-"
    if column in ("prefill", "decode"):  # instances x tp
        return value.label if value is not None else "-"
    return str(value)


def count_line(cells: Sequence[Cell]) -> str:
    """`18 cells (demo: 18); replay time 9.0 GPU-min in total` (GPUs x duration, summed)."""
    per_key: dict[str, int] = {}
    for cell in cells:
        per_key[cell.config_key] = per_key.get(cell.config_key, 0) + 1
    keys = ", ".join(f"{k}: {n}" for k, n in per_key.items())
    gpu_s = sum(c.gpus * c.duration for c in cells)
    noun = "cell" if len(cells) == 1 else "cells"
    total = f"{gpu_s / 60:.1f} GPU-min" if gpu_s < 7200 else f"{gpu_s / 3600:.1f} GPU-h"
    return f"{len(cells)} {noun} ({keys}); replay time {total} in total"


def capacity_lines(cells: Sequence[Cell]) -> list[str]:
    """Per capacity cell: its search, tiers, step budget and the job's time limit (the dry run's)."""
    from agentsweep.capacity.run import describe

    lines = []
    for cell in cells:
        if cell.capacity is not None:
            lines += [f"{cell.exp_name}:", *(f"  {line}" for line in describe(cell))]
    return lines


def table(cells: Sequence[Cell]) -> str:
    columns = _columns(cells)
    rows = [list(columns)] + [[_cell_text(c, col) for col in columns] for c in cells]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    numeric = {"tp", "ep", "users", "cpu_dram_gb", "duration", "replicas", "gpus", "nodes"}
    lines = []
    for row in rows:
        parts = [
            text.rjust(w) if col in numeric else text.ljust(w)
            for text, w, col in zip(row, widths, columns, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    searches = capacity_lines(cells)
    return "\n".join([*lines, "", count_line(cells), *(["", *searches] if searches else [])])


def markdown(cells: Sequence[Cell]) -> str:
    columns = _columns(cells)
    head = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = [
        "| "
        + " | ".join(
            f"`{_cell_text(c, col)}`" if col == "exp_name" else _cell_text(c, col) for col in columns
        )
        + " |"
        for c in cells
    ]
    return "\n".join([f"### Sweep matrix: {count_line(cells)}", "", head, rule, *body, ""])


def max_parallel(cells: Sequence[Cell], limits: Mapping[str, int | None]) -> int:
    """The smallest `max_parallel` among the selected keys, else the cell count (at least 1)."""
    wanted = [n for key, n in limits.items() if n is not None and any(c.config_key == key for c in cells)]
    return max(1, min(wanted) if wanted else len(cells))


# GitHub's concurrency group names are strings of bounded length: a long key set is named by its digest.
SWEEP_KEYS_MAX_CHARS = 200


def sweep_keys(cells: Sequence[Cell]) -> str:
    """The sweep's config keys, however they were asked for (globs, order, spaces, repeats): sorted,
    comma-separated; the workflow's concurrency group, so two spellings of one sweep never run at once.
    Beyond SWEEP_KEYS_MAX_CHARS the set is named by its SHA-256 (first 16 hex digits)."""
    text = ",".join(sorted({c.config_key for c in cells}))
    if len(text) <= SWEEP_KEYS_MAX_CHARS:
        return text
    return "sha256-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def write_github_output(
    cells: Sequence[Cell], env: Mapping[str, str], limits: Mapping[str, int | None] | None = None
) -> list[str]:
    """Append `matrix=`, `count=`, `max_parallel=`, `keys=` to $GITHUB_OUTPUT and a table to $GITHUB_STEP_SUMMARY.

    Returns the names of the variables that were not set (nothing is written for those).
    """
    missing = []
    output = env.get("GITHUB_OUTPUT")
    if output:
        _append(
            "GITHUB_OUTPUT",
            output,
            f"matrix={matrix_json(cells)}\ncount={len(cells)}\n"
            f"max_parallel={max_parallel(cells, limits or {})}\nkeys={sweep_keys(cells)}\n",
        )
    else:
        missing.append("GITHUB_OUTPUT")
    summary = env.get("GITHUB_STEP_SUMMARY")
    if summary:
        _append("GITHUB_STEP_SUMMARY", summary, markdown(cells) + "\n")
    else:
        missing.append("GITHUB_STEP_SUMMARY")
    return missing


def _append(variable: str, path: str, text: str) -> None:
    """Append to the file an Actions variable names; a path that cannot be written is bad input."""
    try:
        with Path(path).open("a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as err:
        raise InputError(f"${variable} ({path}): cannot append: {err.strerror or err}") from None
