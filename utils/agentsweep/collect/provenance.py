"""What produced each point, from its receipt, and the refusal to mix points that were measured
differently (ARCHITECTURE.md §3 receipt.json; issue "results that travel", receipts).

A cell's receipt names the replayer's version and the recipe fingerprint: the cell without its load
(``users``, ``exp_name``) together with the engine version, the image and the client version. Collect
and compare put points side by side, so they refuse, unless told ``--allow-mixed``:

- points measured by different replayer versions;
- in collect, points of one curve (cells equal but for their load) with different recipes;
- in compare, a cell of A and its match in B with different recipes.

Each refusal names what differs (the replayer versions, or the engine version, image or client
version of the recipes) and where. A point without a receipt (an older result) has no provenance to
compare: beside points that have one it is refused the same way, named; a sweep where no point has a
receipt has nothing to compare. A capacity cell is no point itself (its steps are).

Before any of this, each result directory is checked against its receipt as `agentsweep verify` checks
it, as it is read (``contract.cellresult``): a file changed, missing, added or unreadable since the
cell ended, a non-finite number, or a receipt that cannot be read makes its row MALFORMED, never
SUCCESS.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from agentsweep.collect.table import TableRow
from agentsweep.contract.receipt import FINGERPRINT_EXCLUDED, Receipt
from agentsweep.contract.resultdir import RECEIPT_JSON
from agentsweep.errors import InputError

# summary.csv columns taken from the receipt (engine_version and image are columns already).
RECEIPT_COLUMNS = ("replayer_version", "client_version", "recipe_fingerprint")
# What goes into a recipe besides the cell, as summary.csv names it: what a refusal names.
RECIPE_PARTS = (
    ("engine_version", "engine version"),
    ("image", "image"),
    ("client_version", "client version"),
)
# Rows that are points (FAILED and MISSING cells are not).
POINT_STATUSES = ("SUCCESS", "INVALID")
SHOWN = 3  # cells named per difference; the rest are counted


class MixedError(InputError):
    """Points measured differently would be put side by side. Message: what differs and where."""


def receipt_columns(receipt: Receipt | None) -> dict[str, str]:
    """The receipt's columns for one result directory (``CellIdentity.receipt``, checked against the
    directory as it was read); empty without a receipt."""
    if receipt is None:
        return {}
    return {
        "replayer_version": receipt.replayer_version or "",
        "client_version": receipt.recipe.client_version or "",
        "recipe_fingerprint": receipt.recipe_fingerprint,
    }


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)


def _named(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def _all_points(df: pd.DataFrame) -> list[TableRow]:
    """The rows that are points (a capacity cell is not: its steps are), with a receipt or not."""
    if "status" not in df.columns:
        return []
    rows = df.to_dict("records")
    return [r for r in rows if r.get("status") in POINT_STATUSES and not _text(r.get("capacity"))]


def _points(df: pd.DataFrame) -> list[TableRow]:
    """The rows that are points and carry a receipt."""
    return [r for r in _all_points(df) if _text(r.get("recipe_fingerprint"))]


def _unreceipted(df: pd.DataFrame) -> list[str]:
    """The points without a receipt, when some other point has one (else there is nothing to compare)."""
    rows = _all_points(df)
    bare = [_text(r.get("exp_name")) for r in rows if not _text(r.get("recipe_fingerprint"))]
    return bare if len(bare) < len(rows) else []


def _replayers(rows: Iterable[TableRow]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(_text(row.get("replayer_version")) or "unknown", []).append(_text(row.get("exp_name")))
    return out


def _recipe_difference(rows: Sequence[TableRow]) -> str:
    """Which recipe parts the rows disagree on: ``engine version sim-1 (a), sim-2 (b)``."""
    parts = []
    for column, label in RECIPE_PARTS:
        values: dict[str, list[str]] = {}
        for row in rows:
            values.setdefault(_text(row.get(column)) or "none", []).append(_text(row.get("exp_name")))
        if len(values) > 1:
            parts.append(f"{label} " + ", ".join(f"{v} ({_named(n)})" for v, n in sorted(values.items())))
    return "; ".join(parts) or "the recipe fingerprints differ"


def curve_key(row: TableRow, cell_fields: Iterable[str]) -> str:
    """What a curve's points share: every cell field but the load and the name."""
    return json.dumps(
        {f: _text(row.get(f)) for f in cell_fields if f not in FINGERPRINT_EXCLUDED}, sort_keys=True
    )


def mixed_in_sweep(df: pd.DataFrame, cell_fields: Iterable[str]) -> list[str]:
    """Within one collected sweep: points without a receipt beside points with one, different replayer
    versions, and curves whose points have different recipes. One line per difference; none when the
    points agree."""
    points = _points(df)
    problems = []
    bare = _unreceipted(df)
    if bare:
        problems.append(
            f"{len(bare)} point(s) without a {RECEIPT_JSON} beside points with one ({_named(bare)}): "
            "what measured them cannot be compared"
        )
    replayers = _replayers(points)
    if len(replayers) > 1:
        problems.append(
            "replayer versions differ: "
            + "; ".join(f"{v} ({_named(n)})" for v, n in sorted(replayers.items()))
        )
    fields = [f for f in cell_fields if f in df.columns]
    curves: dict[str, list[TableRow]] = {}
    for row in points:
        curves.setdefault(curve_key(row, fields), []).append(row)
    for rows in curves.values():
        if len({_text(r["recipe_fingerprint"]) for r in rows}) > 1:
            problems.append(f"one curve, different recipes: {_recipe_difference(rows)}")
    return problems


def mixed_between(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str], names: tuple[str, str]) -> list[str]:
    """Between two collected sweeps: different replayer versions, and matched cells (equal ``keys``)
    with different recipes."""
    pa, pb = _points(a), _points(b)
    problems = []
    ra, rb = set(_replayers(pa)), set(_replayers(pb))
    if pa and pb and ra != rb:
        problems.append(
            f"replayer versions differ: {names[0]} {', '.join(sorted(ra))}, {names[1]} {', '.join(sorted(rb))}"
        )
    index = {tuple(_text(r.get(k)) for k in keys): r for r in pb}
    pairs = [(r, index[k]) for r in pa if (k := tuple(_text(r.get(k)) for k in keys)) in index]
    differ = [(ra_, rb_) for ra_, rb_ in pairs if ra_["recipe_fingerprint"] != rb_["recipe_fingerprint"]]
    if differ:
        parts = []
        for column, label in RECIPE_PARTS:
            seen = {(_text(x.get(column)) or "none", _text(y.get(column)) or "none") for x, y in differ}
            changed = sorted(f"{va} -> {vb}" for va, vb in seen if va != vb)
            if changed:
                parts.append(f"{label} {', '.join(changed)}")
        cells = [_text(x.get("exp_name")) for x, _ in differ]
        what = "; ".join(parts) or "the recipe fingerprints differ"
        problems.append(
            f"{len(differ)} matched cell(s) have different recipes from {names[0]} to {names[1]} "
            f"({_named(cells)}): {what}"
        )
    return problems


def refuse_mixed(problems: Sequence[str], where: str) -> None:
    """MixedError naming every difference, with the way to go on anyway."""
    if problems:
        raise MixedError(
            f"{where}: points measured differently: {' | '.join(problems)} (pass --allow-mixed to put them "
            "side by side anyway)"
        )
