"""Two collected sweeps side by side: cells matched on their sweep coordinates, B / A per metric."""

from __future__ import annotations

import math

import pandas as pd

from agentsweep.errors import InputError

DEFAULT_KEYS = ("tp", "ep", "users", "offload")
# (column, better) — better tells the reader which way a ratio above 1 points.
METRICS = (
    ("output_tok_per_s_per_gpu", "higher"),
    ("total_tok_per_s_per_gpu", "higher"),
    ("ttft_p50_s", "lower"),
    ("ttft_p99_s", "lower"),
    ("tpot_p50_s", "lower"),
    ("interactivity_p50_tok_per_s", "higher"),
    ("e2e_p50_s", "lower"),
    ("gpu_hit_rate", "higher"),
    ("cpu_hit_rate", "higher"),
)


def _complete(df: pd.DataFrame, keys: tuple[str, ...]) -> pd.Series:
    """Rows whose every key column has a value."""
    return df[list(keys)].notna().all(axis=1)


def compare(
    a: pd.DataFrame,
    b: pd.DataFrame,
    keys: tuple[str, ...] = DEFAULT_KEYS,
    names: tuple[str, str] = ("A", "B"),
) -> pd.DataFrame:
    """One row per key combination found in either sweep; ratio columns are B / A.

    The keys must identify a cell in each sweep: a key column that is missing, or a combination
    two cells share, is an InputError (merging would silently pair cells at random).
    """
    keys = tuple(dict.fromkeys(keys))
    if not keys:
        raise InputError("--on: no columns given to match cells on")
    for df, name in ((a, names[0]), (b, names[1])):
        missing = [k for k in keys if k not in df.columns]
        if missing:
            raise InputError(f"{name}: no column {', '.join(missing)} to match cells on (--on)")
        keyed = df[_complete(df, keys)]
        dup = keyed[keyed.duplicated(list(keys), keep=False)]
        if not dup.empty:
            first = ", ".join(f"{k}={dup.iloc[0][k]}" for k in keys)
            raise InputError(
                f"{name}: {len(dup)} cells share {first} (add config_key or use exp_name in --on "
                "so each cell is matched once)"
            )
    # Each side's own cell name and status, whatever the keys are (exp_name may be one of them).
    carried = ["exp_name", "status", *[m for m, _ in METRICS]]

    def side(df: pd.DataFrame, suffix: str) -> pd.DataFrame:
        part = df[list(keys)].copy()
        for c in carried:
            part[f"{c}{suffix}"] = df[c] if c in df.columns else math.nan
        return part

    ok_a, ok_b = _complete(a, keys), _complete(b, keys)
    merged = side(a[ok_a], "_a").merge(side(b[ok_b], "_b"), on=list(keys), how="outer", sort=True)
    # A cell without its key values (a malformed one) can match nothing: listed, never paired.
    frames = [f for f in (merged, side(a[~ok_a], "_a"), side(b[~ok_b], "_b")) if not f.empty]
    if len(frames) > 1:
        merged = pd.concat(frames, ignore_index=True)
    for m, _ in METRICS:
        va = pd.to_numeric(merged[f"{m}_a"], errors="coerce")
        vb = pd.to_numeric(merged[f"{m}_b"], errors="coerce")
        merged[f"{m}_ratio"] = (vb / va).where((va != 0) & va.notna() & vb.notna())
    merged["matched"] = merged["exp_name_a"].notna() & merged["exp_name_b"].notna()
    return merged


def _fmt(value: object, digits: int = 3) -> str:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value) if value is not None else "–"
    if not math.isfinite(number):
        return "–"
    return f"{number:.{digits}g}" if abs(number) < 1e4 else f"{number:,.0f}"


def _status(value: object) -> str:
    return value if isinstance(value, str) and value else "absent"


def markdown(table: pd.DataFrame, name_a: str, name_b: str, keys: tuple[str, ...] = DEFAULT_KEYS) -> str:
    keys = tuple(k for k in keys if k in table.columns) or ("exp_name_a",)
    shown = [m for m, _ in METRICS[:6]] + ["gpu_hit_rate"]
    lines = [
        f"## Compare: B = `{name_b}` vs A = `{name_a}`",
        "",
        "Ratios are B / A. Better when above 1: "
        + ", ".join(m for m, d in METRICS if d == "higher")
        + "; better when below 1: "
        + ", ".join(m for m, d in METRICS if d == "lower")
        + ".",
        "",
    ]
    header = [*keys, "status A", "status B", *[f"{m} B/A" for m in shown]]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.to_dict("records"):
        cells = [_fmt(row.get(k)) for k in keys]
        cells += [_status(row.get("status_a")), _status(row.get("status_b"))]
        cells += [_fmt(row.get(f"{m}_ratio")) for m in shown]
        lines.append("| " + " | ".join(cells) + " |")
    matched = int(table["matched"].sum()) if "matched" in table else 0
    lines += ["", f"{matched} matched cells of {len(table)}.", ""]
    return "\n".join(lines)
