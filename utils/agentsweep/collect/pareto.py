"""Pareto frontiers of throughput per GPU against latency or interactivity.

A point dominates another when it is at least as good on both axes and better on one; the
frontier is the set of points no other point dominates. Latency axes are better low, throughput
and interactivity axes better high.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from agentsweep.collect.table import TableRow

# y axes: throughput per GPU (higher is better)
Y_METRICS: dict[str, str] = {
    "output_tok_per_s_per_gpu": "Output throughput per GPU (tok/s)",
    "total_tok_per_s_per_gpu": "Total throughput per GPU (tok/s)",
    "input_tok_per_s_per_gpu": "Input throughput per GPU (tok/s)",
}


@dataclass(frozen=True)
class XMetric:
    column: str
    label: str
    minimize: bool


X_METRICS: tuple[XMetric, ...] = (
    XMetric("ttft_p50_s", "TTFT p50 (s)", True),
    XMetric("ttft_p90_s", "TTFT p90 (s)", True),
    XMetric("ttft_p99_s", "TTFT p99 (s)", True),
    XMetric("interactivity_p50_tok_per_s", "Interactivity at p50: 1 / full-response ITL (tok/s/user)", False),
    XMetric("interactivity_p90_tok_per_s", "Interactivity at p90: 1 / full-response ITL (tok/s/user)", False),
    XMetric("interactivity_p99_tok_per_s", "Interactivity at p99: 1 / full-response ITL (tok/s/user)", False),
    XMetric("e2e_p50_s", "E2E latency p50 (s)", True),
    XMetric(
        "e2e_norm_interactivity_p90_tok_per_s",
        "E2E-normalised interactivity at p90: 1 / p90 of E2E per output token (tok/s/user)",
        False,
    ),
)
X_BY_COLUMN = {x.column: x for x in X_METRICS}


def dominates(a: tuple[float, float], b: tuple[float, float], minimize_x: bool) -> bool:
    """True when point a (x, y) dominates b; y is always maximised."""
    ax, ay = a
    bx, by = b
    x_ok = ax <= bx if minimize_x else ax >= bx
    x_better = ax < bx if minimize_x else ax > bx
    return x_ok and ay >= by and (x_better or ay > by)


def frontier(points: Sequence[tuple[float, float]], minimize_x: bool) -> list[int]:
    """Indices of the non-dominated points (non-finite points never qualify), sorted by x.

    Sweep in order of x from best to worst (ties: higher y first); a point is on the frontier when
    its y beats every y seen so far, or equals the best y at the same x (an exact duplicate).
    """
    valid = [i for i, (x, y) in enumerate(points) if math.isfinite(x) and math.isfinite(y)]
    sign = 1.0 if minimize_x else -1.0
    order = sorted(valid, key=lambda i: (sign * points[i][0], -points[i][1]))
    keep: list[int] = []
    best_y = -math.inf
    best_point: tuple[float, float] | None = None
    for i in order:
        point = (float(points[i][0]), float(points[i][1]))
        if point[1] > best_y:
            keep.append(i)
            best_y, best_point = point[1], point
        elif point == best_point:
            keep.append(i)
    return sorted(keep, key=lambda i: (points[i][0], points[i][1]))


SERIES_KINDS = ("engine_offload", "engine_offload_tp", "pooled")


def series_of(df: pd.DataFrame, kind: str) -> dict[str, pd.DataFrame]:
    """Groups of rows for one series kind, keyed by a readable label."""
    if df.empty:
        return {}
    if kind == "pooled":
        return {"all cells": df}
    keys = ["engine", "offload", *ROUTING] + (["tp"] if kind == "engine_offload_tp" else [])
    groups: dict[str, pd.DataFrame] = {}
    for values, group in df.groupby(keys, dropna=False, sort=True):
        parts = dict(zip(keys, values if isinstance(values, tuple) else (values,), strict=True))
        label = f"{parts['engine']} offload={parts['offload']}{routing_label(parts)}"
        if "tp" in parts:
            label += f" tp={_int_text(parts['tp'])}"
        groups[label] = group
    return groups


# Cells behind a router are further split by policy and disaggregation shape; a single engine has
# both empty, and its series and labels are as without them.
ROUTING = ("router", "disagg")


def routing_label(parts: dict[str, object] | pd.Series) -> str:
    """`` router=<policy>`` and `` disagg=<shape>`` where the cell has them, else empty."""
    return "".join(f" {key}={parts[key]}" for key in ROUTING if parts.get(key))


def routed(df: pd.DataFrame) -> bool:
    """True when some cell of ``df`` runs behind a router."""
    if "router" not in df.columns:
        return False
    return any(isinstance(v, str) and v for v in df["router"].tolist())


def _int_text(value: object) -> str:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value)
    return str(int(number)) if number.is_integer() else str(number)


FRONTIER_COLUMNS = (
    "series_kind",
    "series",
    "x_metric",
    "y_metric",
    "rank",
    "exp_name",
    "x",
    "y",
    "engine",
    "offload",
    "tp",
    "users",
    "router",
    "disagg",
)


def successful(df: pd.DataFrame, include_invalid: bool = False) -> pd.DataFrame:
    """Rows the frontiers may use: SUCCESS cells (and INVALID ones when asked) with their numbers."""
    if df.empty or "status" not in df.columns:
        return df.iloc[0:0]
    usable = ("SUCCESS", "INVALID") if include_invalid else ("SUCCESS",)
    ok = df[df["status"].isin(usable)].copy()
    if "capacity" in ok.columns:  # a capacity cell's row has no figures of its own (its steps do)
        ok = ok[ok["capacity"].isna() | (ok["capacity"].astype(str) == "")]
    for column in ("engine", "offload"):
        if column not in ok.columns:
            ok[column] = "?"
        ok[column] = ok[column].fillna("?").astype(str)
    for column in ROUTING:
        if column not in ok.columns:
            ok[column] = ""
        ok[column] = ok[column].astype(object).where(ok[column].notna(), "").astype(str)
    for column in ("tp", "users"):
        if column not in ok.columns:
            ok[column] = float("nan")
    return ok


# The cell columns a frontier point carries (frontier.csv).
_ROW_COLUMNS = ("exp_name", "engine", "offload", "tp", "users", "router", "disagg")


def point_rows(df: pd.DataFrame, columns: Sequence[str]) -> list[TableRow]:
    """``columns`` (those ``df`` has) of each row of ``df`` as a dict, in order. A collected table is
    wide (a few hundred columns): a row Series per point, or a dict of every column, cost more than
    what is drawn or written from it."""
    rows: list[TableRow] = df[[c for c in columns if c in df.columns]].to_dict("records")
    return rows


def frontier_table(df: pd.DataFrame, include_invalid: bool = False) -> pd.DataFrame:
    """Every frontier point for every series kind, x metric and y metric (frontier.csv)."""
    ok = successful(df, include_invalid)
    records: list[dict[str, object]] = []
    for kind in SERIES_KINDS:
        for label, group in series_of(ok, kind).items():
            rows = point_rows(group, _ROW_COLUMNS)
            for y in Y_METRICS:
                if y not in group.columns:
                    continue
                for xm in X_METRICS:
                    if xm.column not in group.columns:
                        continue
                    pts = list(
                        zip(
                            pd.to_numeric(group[xm.column], errors="coerce").astype(float),
                            pd.to_numeric(group[y], errors="coerce").astype(float),
                            strict=True,
                        )
                    )
                    for rank, i in enumerate(frontier(pts, xm.minimize), start=1):
                        row = rows[i]
                        records.append(
                            {
                                "series_kind": kind,
                                "series": label,
                                "x_metric": xm.column,
                                "y_metric": y,
                                "rank": rank,
                                "exp_name": row["exp_name"],
                                "x": pts[i][0],
                                "y": pts[i][1],
                                "engine": row["engine"],
                                "offload": row["offload"],
                                "tp": row["tp"],
                                "users": row["users"],
                                "router": row["router"],
                                "disagg": row["disagg"],
                            }
                        )
    return pd.DataFrame.from_records(records, columns=list(FRONTIER_COLUMNS))
