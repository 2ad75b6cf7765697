"""Two collected sweeps side by side: cells matched on their sweep coordinates, B / A per metric."""

from __future__ import annotations

import math
import re

import pandas as pd

from agentsweep.errors import InputError

DEFAULT_KEYS = ("tp", "ep", "users", "offload")
# Every axis of a cell, so a single-engine cell never meets a routed or disaggregated one of the same
# TP. Summaries collected before an axis existed lack its column: such a cell had the default.
AXES = (*DEFAULT_KEYS, "replicas", "router", "prefill", "decode", "gpus")
AXIS_DEFAULTS: dict[str, object] = {"replicas": 1, "router": "", "prefill": "", "decode": ""}
INTEGER_AXES = ("tp", "ep", "users", "replicas", "gpus", "nodes")
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


def _where(df: pd.DataFrame, i: int) -> str:
    name = df["exp_name"].iloc[i] if "exp_name" in df.columns else None
    return f"cell {_plain(name)}" if isinstance(name, str) and name else f"row {i + 2}"


def checked(df: pd.DataFrame, keys: tuple[str, ...], name: str) -> pd.DataFrame:
    """``df`` with the cell axes among ``keys`` filled (a summary without an axis's column: the
    default) and typed, and its metric columns checked: an integer axis that is not an integer, or a
    metric that is text, NaN, infinite or negative, is an InputError naming the cell and column."""
    df = df.copy()
    for axis, default in AXIS_DEFAULTS.items():
        if axis in keys:
            col = (
                df[axis].astype(object)
                if axis in df.columns
                else pd.Series(None, index=df.index, dtype=object)
            )
            df[axis] = col.where(col.notna(), default)
    if "gpus" in keys:
        tp = df["tp"] if "tp" in df.columns else pd.Series(None, index=df.index, dtype=object)
        df["gpus"] = df["gpus"].where(df["gpus"].notna(), tp) if "gpus" in df.columns else tp
    for col in INTEGER_AXES:
        if col not in keys or col not in df.columns:
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        bad = (df[col].notna() & ~(values.notna() & (values % 1 == 0) & (values > 0))).to_numpy().nonzero()[0]
        if len(bad):
            i = int(bad[0])
            raise InputError(
                f"{name}: {_where(df, i)}: {col}: expected a positive integer, got {_plain(df[col].iloc[i])!r}"
            )
        df[col] = values.astype("Int64")
    for col in (c for c in keys if c not in INTEGER_AXES and c in df.columns):
        df[col] = df[col].map(lambda v: v if pd.isna(v) else str(v))
    for m, _ in METRICS:
        if m not in df.columns:
            continue
        values = pd.to_numeric(df[m], errors="coerce")
        bad = (
            (df[m].notna() & ~(values.notna() & values.map(math.isfinite) & (values >= 0)))
            .to_numpy()
            .nonzero()[0]
        )
        if len(bad):
            i = int(bad[0])
            raise InputError(
                f"{name}: {_where(df, i)}: {m}: expected a finite number >= 0, got {_plain(df[m].iloc[i])!r}"
            )
        df[m] = values
    return df


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


_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x1f\x7f-\x9f]")
_MARKUP = re.compile(r"([\\`*_\[\]<>|~])")


def _plain(value: object) -> str:
    """Text without terminal escape sequences or other control characters (a status copied from a
    log), at most 200 characters."""
    text = _CONTROL.sub("", str(value))
    return text if len(text) <= 200 else text[:199] + "…"


def _code(value: object) -> str:
    """Text for inside a Markdown code span (which cannot hold a backtick)."""
    return _plain(value).replace("`", "'")


def md_text(value: object) -> str:
    """``value`` as literal Markdown table text: no control characters, markup escaped."""
    return _MARKUP.sub(r"\\\1", _plain(value))


def _fmt(value: object, digits: int = 3) -> str:
    if value is None or value is pd.NA:
        return "–"
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return md_text(value)
    if not math.isfinite(number):
        return "–"
    return f"{number:.{digits}g}" if abs(number) < 1e4 else f"{number:,.0f}"


def _status(value: object) -> str:
    return md_text(value) if isinstance(value, str) and value else "absent"


def shown_keys(table: pd.DataFrame, keys: tuple[str, ...]) -> tuple[str, ...]:
    """The keys compare.md shows: each one given, less the added axes no cell sets (a sweep of single
    engines needs no replicas, router or split columns; gpus only where it is not tp)."""
    shown = []
    for k in keys:
        if k not in table.columns:
            continue
        if k in AXIS_DEFAULTS and table[k].fillna(AXIS_DEFAULTS[k]).eq(AXIS_DEFAULTS[k]).all():
            continue
        if k == "gpus" and "tp" in table.columns and table["gpus"].fillna(table["tp"]).eq(table["tp"]).all():
            continue
        shown.append(k)
    return tuple(shown)


def markdown(table: pd.DataFrame, name_a: str, name_b: str, keys: tuple[str, ...] = DEFAULT_KEYS) -> str:
    keys = shown_keys(table, keys) or ("exp_name_a",)
    shown = [m for m, _ in METRICS[:6]] + ["gpu_hit_rate"]
    lines = [
        f"## Compare: B = `{_code(name_b)}` vs A = `{_code(name_a)}`",
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
