"""PNG plots of a collected sweep: Pareto panels per throughput metric, cache panels, hit rates, joules
per output token against interactivity (cells with valid power), and for routed cells the router's
requests per engine instance over the run.

Uses matplotlib's object API (no pyplot state), so it is safe in tests and headless CI.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, PercentFormatter

from agentsweep.collect.capacity import hardware_of
from agentsweep.collect.output import save_figure
from agentsweep.collect.pareto import (
    ROUTING,
    X_BY_COLUMN,
    X_METRICS,
    Y_METRICS,
    XMetric,
    frontier,
    point_rows,
    successful,
)
from agentsweep.collect.table import TableRow
from agentsweep.contract.resultdir import ROUTER_METRICS_CSV
from agentsweep.errors import ResultFileError
from agentsweep.metrics.scrapes import ScrapeReader
from agentsweep.style import (
    INVALID_COLOR,
    OFFLOAD_COLORS,
    OFFLOAD_NAMES,
    ROUTED_COLORS,
    offload_color,
    tp_marker,
)

__all__ = ["INVALID_COLOR", "OFFLOAD_COLORS", "OFFLOAD_NAMES", "PLOT_FILES", "write_plots"]

ENGINE_STYLES = ("-", "--", ":", "-.")
LABEL_ALL_MAX = 36  # label every point up to this many cells, else only frontier points
DPI = 120
# A panel title's height, given so matplotlib does not move it clear of a top axis these panels never
# have (that search measured every tick label of the panel: about a sixth of a figure's time).
TITLE_Y = 1.0


def _color(offload: str) -> str:
    return offload_color(offload)


SeriesKey = tuple[str, str, str]  # (offload, router policy, disaggregation shape)


# The cell columns a plot reads of a point (its series, marker and label).
_POINT_COLUMNS = ("exp_name", "result_dir", "engine", "offload", "tp", "users", "replicas", *ROUTING)


def _rows(df: pd.DataFrame) -> list[TableRow]:
    return point_rows(df, _POINT_COLUMNS)


def _series_key(row: TableRow) -> SeriesKey:
    return (str(row["offload"]), str(row.get("router") or ""), str(row.get("disagg") or ""))


def _series_styles(ok: pd.DataFrame) -> dict[SeriesKey, tuple[str, str]]:
    """Colour and legend label of every (offload, router, disagg) series present, in legend order.

    Cells without a router keep their offload mode's colour and name, so a single-engine sweep is
    drawn as it always was; each routed combination gets a colour of its own.
    """
    if ok.empty:
        return {}
    order = {name: i for i, name in enumerate(OFFLOAD_COLORS)}
    routing = [ok[c] if c in ok else pd.Series([""] * len(ok), index=ok.index) for c in ROUTING]
    keys = sorted(
        {(str(o), str(r), str(d)) for o, r, d in zip(ok["offload"], *routing, strict=True)},
        key=lambda k: (bool(k[1] or k[2]), order.get(k[0], len(order)), k),
    )
    styles: dict[SeriesKey, tuple[str, str]] = {}
    for offload, router, disagg in keys:
        if not router and not disagg:
            styles[(offload, router, disagg)] = (_color(offload), OFFLOAD_NAMES.get(offload, offload))
            continue
        color = ROUTED_COLORS[sum(1 for k in styles if k[1] or k[2]) % len(ROUTED_COLORS)]
        parts = [f"offload {offload}", f"router {router}" if router else "no router", disagg]
        styles[(offload, router, disagg)] = (color, " · ".join(p for p in parts if p))
    return styles


def _tp_text(tp: object) -> str:
    try:
        value = float(tp)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "?"
    return str(int(value)) if math.isfinite(value) and value.is_integer() else "?"


def _styles(ok: pd.DataFrame) -> tuple[dict[str, str], dict[str, str]]:
    """(marker per TP present, line style per engine): a TP's marker is the one agentsweep.style gives
    it, whichever other TPs the sweep has."""
    tps = sorted({_tp_text(t) for t in ok["tp"]}, key=lambda t: (len(t), t))
    engines = sorted(set(ok["engine"]))
    markers = {tp: tp_marker(tp)[0] for tp in tps}
    styles = {e: ENGINE_STYLES[i % len(ENGINE_STYLES)] for i, e in enumerate(engines)}
    return markers, styles


def _thousands(value: float, _pos: int) -> str:
    if abs(value) >= 1000:
        return f"{value / 1000:.0f}k" if value % 1000 == 0 else f"{value / 1000:.1f}k"
    return f"{value:g}"


def _point_label(row: TableRow) -> str:
    users = row.get("users")
    u = _tp_text(users)
    replicas = _tp_text(row.get("replicas"))
    return f"u{u}·tp{_tp_text(row.get('tp'))}" + (f"·r{replicas}" if replicas not in ("?", "1") else "")


def _panel(
    ax: Axes,
    ok: pd.DataFrame,
    xm: XMetric,
    y: str,
    markers: dict[str, str],
    styles: dict[str, str],
    series: dict[SeriesKey, tuple[str, str]],
) -> None:
    xs = pd.to_numeric(ok[xm.column], errors="coerce") if xm.column in ok else pd.Series(dtype=float)
    ys = pd.to_numeric(ok[y], errors="coerce") if y in ok else pd.Series(dtype=float)
    have = ok[np.isfinite(xs) & np.isfinite(ys)] if len(xs) else ok.iloc[0:0]
    ax.set_title(xm.label.split(" (")[0], fontsize=11, loc="left", fontweight="bold", y=TITLE_Y)
    ax.set_xlabel(xm.label + ("  ← better" if xm.minimize else "  → better"), fontsize=9)
    ax.set_ylabel(Y_METRICS[y], fontsize=9)
    ax.grid(True, which="major", color="#dddddd", linewidth=0.7)
    ax.set_axisbelow(True)
    ax.yaxis.set_major_formatter(FuncFormatter(_thousands))
    if have.empty:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#999999")
        return
    hx = pd.to_numeric(have[xm.column], errors="coerce").to_numpy(float)
    hy = pd.to_numeric(have[y], errors="coerce").to_numpy(float)
    if hx.min() > 0 and hx.max() / hx.min() > 20:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    on_front: set[int] = set()
    for (engine, *key), group in have.groupby(["engine", "offload", *ROUTING], sort=True):
        gx = pd.to_numeric(group[xm.column], errors="coerce").to_numpy(float)
        gy = pd.to_numeric(group[y], errors="coerce").to_numpy(float)
        idx = frontier(list(zip(gx, gy, strict=True)), xm.minimize)
        positions = [have.index.get_loc(group.index[i]) for i in idx]
        on_front.update(positions)
        if len(idx) > 1:
            ax.plot(
                gx[idx],
                gy[idx],
                linestyle=styles[engine],
                color=series[tuple(key)][0],
                linewidth=1.8,
                alpha=0.85,
                zorder=2,
            )
    # One scatter call per (series, TP, on-frontier) group: far fewer artists to lay out and draw.
    groups: dict[tuple[SeriesKey, str, bool], list[int]] = {}
    for pos, row in enumerate(_rows(have)):
        key = (_series_key(row), _tp_text(row["tp"]), pos in on_front)
        groups.setdefault(key, []).append(pos)
        if pos in on_front or len(have) <= LABEL_ALL_MAX:
            ax.annotate(
                _point_label(row),
                (hx[pos], hy[pos]),
                xytext=(4, 4),
                textcoords="offset points",
                fontsize=6.5,
                color="#333333" if pos in on_front else "#888888",
                zorder=4,
            )
    for (key, tp, front), positions in groups.items():
        ax.scatter(
            hx[positions],
            hy[positions],
            marker=markers[tp],
            s=52 if front else 30,
            color=series[key][0],
            edgecolors="black" if front else "white",
            linewidths=0.8 if front else 0.5,
            alpha=1.0 if front else 0.55,
            zorder=3,
        )
    ax.set_ylim(bottom=0, top=max(hy.max() * 1.12, 1e-9))


def _legend_handles(ok: pd.DataFrame, markers: dict[str, str], styles: dict[str, str]) -> list[Line2D]:
    handles: list[Line2D] = []
    for color, label in _series_styles(ok).values():
        handles.append(Line2D([], [], color=color, marker="o", linestyle="-", label=label))
    for tp, marker in markers.items():
        handles.append(Line2D([], [], color="#444444", marker=marker, linestyle="none", label=f"TP={tp}"))
    if len(styles) > 1:
        for engine, style in styles.items():
            handles.append(
                Line2D([], [], color="#444444", linestyle=cast(Any, style), label=f"engine {engine}")
            )
    return handles


def _title(df: pd.DataFrame) -> str:
    """Config keys · models · hardware, the hardware by its label ("simulated H200"), never the runner."""
    columns = [
        sorted({str(v) for v in df[c].dropna()}) if c in df.columns else [] for c in ("config_key", "model")
    ]
    facts = point_rows(df, ("hardware_label", "hardware", "runner"))
    columns.append(sorted({hardware_of(row) for row in facts} - {""}))
    return " · ".join(
        ", ".join(values[:3]) + ("…" if len(values) > 3 else "") for values in columns if values
    )


def _invalid_points(ax: Any, invalid: pd.DataFrame, xm: XMetric, y: str) -> None:
    """INVALID cells as grey hollow points, never joined: seen, but not part of any frontier."""
    if invalid.empty or xm.column not in invalid or y not in invalid:
        return
    xs = pd.to_numeric(invalid[xm.column], errors="coerce")
    ys = pd.to_numeric(invalid[y], errors="coerce")
    mask = np.isfinite(xs) & np.isfinite(ys)
    if mask.any():
        ax.scatter(
            xs[mask], ys[mask], s=36, facecolors="none", edgecolors=INVALID_COLOR, linewidths=1.0, zorder=1
        )


def pareto_figure(df: pd.DataFrame, y: str, path: Path, include_invalid: bool = False) -> Path:
    """One PNG: every x metric against throughput-per-GPU metric ``y``, plus a legend panel."""
    ok = successful(df, include_invalid)
    invalid = df.iloc[0:0] if include_invalid or "status" not in df else df[df["status"] == "INVALID"]
    markers, styles = _styles(ok) if not ok.empty else ({}, {})
    series = _series_styles(ok)
    fig = Figure(figsize=(18, 14), dpi=DPI)
    # A fixed layout: constrained layout costs seconds per figure and the grid never changes (one
    # panel per x metric and the legend's).
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.05, top=0.93, wspace=0.22, hspace=0.3)
    axes = fig.subplots(3, 3).ravel()
    for ax, xm in zip(axes, X_METRICS, strict=False):
        _panel(ax, ok, xm, y, markers, styles, series)
        _invalid_points(ax, invalid, xm, y)
    legend_ax = axes[len(X_METRICS)]
    legend_ax.axis("off")
    if not ok.empty:
        legend_ax.legend(
            handles=_legend_handles(ok, markers, styles), loc="upper left", fontsize=10, frameon=False
        )
    legend_ax.text(
        0.0,
        0.02,
        (
            "Lines join each engine × offload × router × shape series'\n"
            "Pareto frontier (outlined points).\nLabels: concurrent users · TP · replicas.\n"
            if any(k[1] or k[2] for k in series)
            else "Lines join each engine × offload series' Pareto frontier\n"
            "(outlined points). Labels: concurrent users · TP.\n"
        )
        + "Interactivity = 1 / full-response ITL at that percentile.\n"
        + (f"Grey hollow points: {len(invalid)} INVALID cells (left out).\n" if len(invalid) else "")
        + f"{len(ok)} {'usable' if include_invalid else 'successful'} cells of {len(df)}.",
        transform=legend_ax.transAxes,
        fontsize=9,
        color="#444444",
        va="bottom",
    )
    fig.suptitle(f"{Y_METRICS[y]} — {_title(df)}", fontsize=14, x=0.01, ha="left")
    save_figure(fig, path)
    return path


# Where a point's label may go, in points from the point (tried in this order).
LABEL_OFFSETS = ((5, 5), (5, -11), (-5, 5), (-5, -11), (9, -3), (-9, -3))


def _place_labels(ax: Axes, points: list[tuple[float, float, str]], fontsize: float = 7.5) -> None:
    """Label points without overlapping each other: each label takes the first offset whose box (an
    estimate from the text's length) overlaps no label placed before; a label with no free place is
    left out (the point keeps its marker, and the table its figures)."""
    fig = ax.figure
    fig.canvas.draw_idle()
    to_px = ax.transData.transform
    per_pt = fig.dpi / 72.0
    placed: list[tuple[float, float, float, float]] = []
    for x, y, text in points:
        px, py = to_px((x, y))
        width, height = 0.6 * fontsize * len(text) * per_pt, fontsize * 1.2 * per_pt
        for dx, dy in LABEL_OFFSETS:
            left = px + dx * per_pt - (width if dx < 0 else 0)
            bottom = py + dy * per_pt
            box = (left, bottom, left + width, bottom + height)
            if all(box[2] < b[0] or box[0] > b[2] or box[3] < b[1] or box[1] > b[3] for b in placed):
                placed.append(box)
                ax.annotate(
                    text,
                    (x, y),
                    xytext=(dx, dy),
                    textcoords="offset points",
                    ha="right" if dx < 0 else "left",
                    fontsize=fontsize,
                    color="#222222",
                    zorder=5,
                )
                break


# The main Pareto figure: the axes a reader picks first (the rest: pareto_<metric>.png).
MAIN_Y = "output_tok_per_s_per_gpu"
MAIN_X = ("interactivity_p50_tok_per_s", "ttft_p90_s")
MAIN_LEVELS = (20.0, 50.0, 100.0)  # the headline's interactivity levels, drawn as guides


def _log_if_tail(ax: Axes, values: np.ndarray, which: str = "x") -> bool:
    """A log axis where a tail dominates (largest over smallest above 20), with plain tick labels."""
    positive = values[np.isfinite(values) & (values > 0)]
    if not len(positive) or positive.max() / positive.min() <= 20:
        return False
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
    return True


def main_pareto_figure(df: pd.DataFrame, path: Path, include_invalid: bool = False) -> Path:
    """Output tok/s per GPU against interactivity (the headline's levels marked) and against TTFT p90:
    two labelled panels, frontier points named, colour per offload mode and marker per TP."""
    ok = successful(df, include_invalid)
    invalid = df.iloc[0:0] if include_invalid or "status" not in df else df[df["status"] == "INVALID"]
    markers, styles = _styles(ok) if not ok.empty else ({}, {})
    series = _series_styles(ok)
    fig = Figure(figsize=(15, 6.4), dpi=DPI)
    fig.subplots_adjust(left=0.06, right=0.80, bottom=0.11, top=0.88, wspace=0.2)
    axes = fig.subplots(1, 2)
    for ax, column in zip(axes, MAIN_X, strict=True):
        xm = X_BY_COLUMN[column]
        ax.set_xlabel(xm.label + ("  ← better" if xm.minimize else "  → better"), fontsize=10)
        ax.set_ylabel(Y_METRICS[MAIN_Y] + "  ↑ better", fontsize=10)
        ax.set_title(
            xm.label.split(":")[0].split(" (")[0], fontsize=12, loc="left", fontweight="bold", y=TITLE_Y
        )
        ax.grid(True, which="major", color="#dddddd", linewidth=0.7)
        ax.set_axisbelow(True)
        ax.yaxis.set_major_formatter(FuncFormatter(_thousands))
        have = ok
        if not ok.empty:
            xs = pd.to_numeric(ok[column], errors="coerce")
            ys = pd.to_numeric(ok[MAIN_Y], errors="coerce")
            have = ok[np.isfinite(xs) & np.isfinite(ys)]
        if have.empty:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#999999")
            continue
        hx = pd.to_numeric(have[column], errors="coerce").to_numpy(float)
        hy = pd.to_numeric(have[MAIN_Y], errors="coerce").to_numpy(float)
        _log_if_tail(ax, hx)
        labels: list[tuple[float, float, str]] = []
        for (engine, *key), group in have.groupby(["engine", "offload", *ROUTING], sort=True):
            gx = pd.to_numeric(group[column], errors="coerce").to_numpy(float)
            gy = pd.to_numeric(group[MAIN_Y], errors="coerce").to_numpy(float)
            idx = frontier(list(zip(gx, gy, strict=True)), xm.minimize)
            color = series[tuple(key)][0]
            if len(idx) > 1:
                ax.plot(gx[idx], gy[idx], linestyle=styles[engine], color=color, linewidth=1.8, alpha=0.85)
            for pos, row in enumerate(_rows(group)):
                front = pos in idx
                ax.scatter(
                    gx[pos], gy[pos], marker=markers[_tp_text(row["tp"])], s=70 if front else 36, color=color,
                    edgecolors="black" if front else "white", linewidths=0.8, alpha=1.0 if front else 0.6, zorder=3,
                )  # fmt: skip
                if front:
                    labels.append((float(gx[pos]), float(gy[pos]), _point_label(row)))
        _invalid_points(ax, invalid, xm, MAIN_Y)
        ax.set_ylim(bottom=0, top=max(hy.max() * 1.15, 1e-9))
        if column.startswith("interactivity"):
            lo, hi = ax.get_xlim()
            for level in MAIN_LEVELS:
                if lo <= level <= hi:
                    ax.axvline(level, color="#555555", linestyle=":", linewidth=1.0, zorder=1)
                    ax.text(level, ax.get_ylim()[1], f" {level:g} tok/s/user", fontsize=8, color="#555555",
                            va="top", ha="left")  # fmt: skip
        _place_labels(ax, labels)
    legend = fig.add_axes((0.81, 0.11, 0.18, 0.77))
    legend.axis("off")
    if not ok.empty:
        legend.legend(
            handles=_legend_handles(ok, markers, styles), loc="upper left", fontsize=9, frameon=False
        )
    legend.text(
        0.0, 0.0,
        "Lines: each series' Pareto frontier\n(outlined points, labelled\nusers · TP).\n"
        "Interactivity = 1 / median\nfull-response ITL.\n"
        + (f"Grey hollow: {len(invalid)} INVALID cells.\n" if len(invalid) else "")
        + f"{len(ok)} {'usable' if include_invalid else 'successful'} points.",
        transform=legend.transAxes, fontsize=8.5, color="#444444", va="bottom",
    )  # fmt: skip
    fig.suptitle(f"{Y_METRICS[MAIN_Y]} — {_title(df)}", fontsize=13, x=0.01, ha="left")
    save_figure(fig, path)
    return path


def cache_figure(df: pd.DataFrame, path: Path, include_invalid: bool = False) -> Path:
    """GPU and CPU hit rate (server-side, profiling window) against output throughput per GPU."""
    ok = successful(df, include_invalid)
    markers, _ = _styles(ok) if not ok.empty else ({}, {})
    series = _series_styles(ok)
    fig = Figure(figsize=(15, 5.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, 2)
    y = "output_tok_per_s_per_gpu"
    for ax, column, title in (
        (axes[0], "gpu_hit_rate", "GPU prefix-cache hit rate"),
        (axes[1], "cpu_hit_rate", "CPU / external KV hit rate"),
    ):
        ax.set_title(f"{title} vs output throughput per GPU", fontsize=10.5, loc="left", y=TITLE_Y)
        ax.set_xlabel(title + " (share of prompt tokens, profiling window)", fontsize=9)
        ax.set_ylabel(Y_METRICS[y], fontsize=9)
        ax.grid(True, color="#dddddd", linewidth=0.7)
        ax.set_axisbelow(True)
        ax.xaxis.set_major_formatter(PercentFormatter(1.0))
        ax.yaxis.set_major_formatter(FuncFormatter(_thousands))
        xs = pd.to_numeric(ok.get(column, pd.Series(dtype=float)), errors="coerce")
        ys = pd.to_numeric(ok.get(y, pd.Series(dtype=float)), errors="coerce")
        mask = np.isfinite(xs) & np.isfinite(ys) if len(ok) else pd.Series(dtype=bool)
        if not len(ok) or not mask.any():
            ax.text(
                0.5, 0.5, "not reported", transform=ax.transAxes, ha="center", va="center", color="#999999"
            )
            ax.set_xlim(0, 1)
            continue
        rows = _rows(ok)
        for pos in np.flatnonzero(mask.to_numpy()):
            row = rows[pos]
            ax.scatter(
                xs.iloc[pos],
                ys.iloc[pos],
                marker=markers[_tp_text(row["tp"])],
                s=40,
                color=series[_series_key(row)][0],
                edgecolors="white",
                linewidths=0.5,
                zorder=3,
            )
            ax.annotate(
                _point_label(row),
                (xs.iloc[pos], ys.iloc[pos]),
                xytext=(4, 3),
                textcoords="offset points",
                fontsize=6.5,
            )
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(bottom=0, top=max(float(ys[mask].max()) * 1.12, 1e-9))
    if not ok.empty:
        axes[1].legend(handles=_legend_handles(ok, markers, {}), loc="best", fontsize=8.5, framealpha=0.9)
    fig.suptitle(f"KV cache — {_title(df)}", fontsize=13, x=0.01, ha="left")
    save_figure(fig, path)
    return path


def hit_rate_figure(df: pd.DataFrame, path: Path, include_invalid: bool = False) -> Path:
    """Per cell: ideal (infinite-cache) hit rate against what the engine's GPU and CPU tiers hit."""
    ok = successful(df, include_invalid)
    if not ok.empty:
        order = {name: i for i, name in enumerate(OFFLOAD_COLORS)}
        ok = ok.assign(_order=ok["offload"].map(lambda o: order.get(o, len(order))))
    cells = ok.sort_values(["_order", *ROUTING, "tp", "users"], kind="stable") if not ok.empty else ok
    series = _series_styles(ok)
    n = max(len(cells), 1)
    fig = Figure(figsize=(11, 2.2 + 0.28 * n), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    fig.suptitle(
        "Ideal vs measured prefix-cache hit rate per cell (profiling window)", fontsize=11, x=0.01, ha="left"
    )
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlim(0, 1.0)
    ax.grid(True, axis="x", color="#dddddd", linewidth=0.7)
    ax.set_axisbelow(True)
    if cells.empty:
        ax.text(
            0.5, 0.5, "no successful cells", transform=ax.transAxes, ha="center", va="center", color="#999999"
        )
        save_figure(fig, path)
        return path
    ys = np.arange(len(cells))[::-1]

    def col(name: str) -> np.ndarray:
        values = pd.to_numeric(cells.get(name, pd.Series([np.nan] * len(cells))), errors="coerce")
        return np.asarray(values, dtype=float)

    gpu, cpu, ideal = col("gpu_hit_rate"), col("cpu_hit_rate"), col("theoretical_hit_rate")
    both = gpu + np.nan_to_num(cpu)
    colors = [series[_series_key(row)][0] for row in _rows(cells)]
    ax.barh(ys, np.nan_to_num(gpu), color=colors, height=0.62)
    ax.barh(
        ys, np.nan_to_num(cpu), left=np.nan_to_num(gpu), color=colors, alpha=0.4, height=0.62, hatch="///"
    )
    ax.scatter(ideal, ys, marker="|", s=260, color="black", linewidths=2.2, zorder=4)
    for yv, measured, best in zip(ys, both, ideal, strict=True):
        text = (f"{measured:.0%}" if np.isfinite(measured) else "n/a") + (
            f" / {best:.0%}" if np.isfinite(best) else ""
        )
        ax.text(
            1.01, yv, text, va="center", fontsize=7.5, color="#333333", transform=ax.get_yaxis_transform()
        )
    handles = [
        Patch(facecolor="#888888", label="GPU hits"),
        Patch(facecolor="#888888", alpha=0.4, hatch="///", label="CPU / external hits"),
        Line2D(
            [],
            [],
            marker="|",
            color="black",
            linestyle="none",
            markersize=12,
            markeredgewidth=2.2,
            label="ideal (infinite cache)",
        ),
    ] + [Patch(facecolor=color, label=label) for color, label in series.values()]
    ax.legend(
        handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False
    )
    ax.set_yticks(ys, [str(e) for e in cells["exp_name"]], fontsize=7.5)
    ax.set_xlabel("share of prompt tokens served from cache (measured / ideal on the right)", fontsize=9)
    save_figure(fig, path)
    return path


ROUTING_PANELS_MAX = 12


def _router_series(result_dir: object) -> pd.DataFrame | None:
    """A routed cell's router_metrics.csv (time_s, requests.<instance>...), or None if absent/unusable."""
    if not isinstance(result_dir, str) or not result_dir:
        return None
    path = Path(result_dir) / ROUTER_METRICS_CSV
    if not path.is_file():
        return None
    reader = ScrapeReader(path, figures=None)
    try:
        scrapes = list(reader)
    except ResultFileError:
        return None
    counts = [c for c in reader.header if c.startswith("requests.")]
    rows = [
        [s.time_s, *(s.values[c] for c in counts)]
        for s in scrapes
        if all(s.values[c] is not None for c in counts)
    ]
    if not counts or len(rows) < 2:
        return None
    return pd.DataFrame(rows, columns=["time_s", *counts], dtype=float)


def routing_figure(df: pd.DataFrame, path: Path, include_invalid: bool = False) -> Path | None:
    """Per routed cell: the requests the router has sent each instance over the run (router_metrics.csv);
    None when no cell has those scrapes. Even slopes mean a balanced router; a flat line, an idle instance."""
    ok = successful(df, include_invalid)
    if ok.empty or "router" not in ok.columns or "result_dir" not in ok.columns:
        return None
    panels = []
    for row in _rows(ok):
        if not row.get("router"):
            continue
        table = _router_series(row.get("result_dir"))
        if table is not None:
            panels.append((str(row["exp_name"]), table))
    if not panels:
        return None
    panels = panels[:ROUTING_PANELS_MAX]
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 2.9 * nrows + 0.6), dpi=DPI, layout="constrained")
    fig.suptitle(
        "Requests the router sent each engine instance (router_metrics.csv)", fontsize=11, x=0.01, ha="left"
    )
    axes = np.atleast_1d(fig.subplots(nrows, ncols)).ravel()
    for ax, (name, table) in zip(axes, panels, strict=False):
        t = table["time_s"] - table["time_s"].iloc[0]
        for column in table.columns[1:]:
            ax.plot(t, table[column], label=str(column).removeprefix("requests."), linewidth=1.6)
        ax.set_title(name, fontsize=8, loc="left", y=TITLE_Y)
        ax.set_xlabel("seconds since the first scrape (wall clock)", fontsize=8)
        ax.set_ylabel("requests sent", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, color="#dddddd", linewidth=0.7)
        ax.legend(fontsize=7, frameon=False, loc="upper left")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    save_figure(fig, path)
    return path


ENERGY_X = tuple(
    x
    for x in X_METRICS
    if x.column.startswith("interactivity_p") and not x.column.startswith("interactivity_p99")
)
ENERGY_Y = "joules_per_output_token"


def energy_figure(df: pd.DataFrame, path: Path, include_invalid: bool = False) -> Path | None:
    """Joules per output token (lower is better) against interactivity (higher is better), one panel per
    percentile; only cells whose power is valid. None when no cell has a power figure."""
    ok = successful(df, include_invalid)
    if ENERGY_Y not in ok or ok.empty:
        return None
    valid = ok[pd.to_numeric(ok[ENERGY_Y], errors="coerce").notna()]
    withheld = len(ok) - len(valid)
    if valid.empty:  # no cell has a power figure (no source, or every one withheld: the table says why)
        return None
    markers, styles = _styles(ok)
    series = _series_styles(ok)
    fig = Figure(figsize=(15, 6.2), dpi=DPI)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.12, top=0.86, wspace=0.18)
    axes = fig.subplots(1, len(ENERGY_X))
    for ax, xm in zip(np.atleast_1d(axes), ENERGY_X, strict=True):
        _energy_panel(ax, valid, xm, markers, styles, series)
    if not valid.empty:
        np.atleast_1d(axes)[-1].legend(
            handles=_legend_handles(valid, markers, styles), loc="best", fontsize=8
        )
    note = f"; {withheld} cells with power withheld (power_valid false) left out" if withheld else ""
    fig.suptitle(
        f"GPU energy per output token vs interactivity — {_title(df)}{note}", fontsize=12, x=0.01, ha="left"
    )
    save_figure(fig, path)
    return path


def _energy_panel(
    ax: Axes,
    valid: pd.DataFrame,
    xm: XMetric,
    markers: dict[str, str],
    styles: dict[str, str],
    series: dict[SeriesKey, tuple[str, str]],
) -> None:
    ax.set_title(xm.label.split(" (")[0], fontsize=11, loc="left", fontweight="bold", y=TITLE_Y)
    ax.set_xlabel(xm.label + "  → better", fontsize=9)
    ax.set_ylabel("GPU energy per output token (J)  ↓ better", fontsize=9)
    ax.grid(True, which="major", color="#dddddd", linewidth=0.7)
    ax.set_axisbelow(True)
    xs = pd.to_numeric(valid.get(xm.column), errors="coerce") if xm.column in valid else None
    if xs is None or valid.empty or not np.isfinite(xs.to_numpy(float)).any():
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#999999")
        return
    for (engine, *key), group in valid.groupby(["engine", "offload", *ROUTING], sort=True):
        gx = pd.to_numeric(group[xm.column], errors="coerce").to_numpy(float)
        gy = pd.to_numeric(group[ENERGY_Y], errors="coerce").to_numpy(float)
        color = series[tuple(key)][0]
        idx = frontier(list(zip(gx, -gy, strict=True)), minimize_x=False)  # least energy at each speed
        if len(idx) > 1:
            ax.plot(gx[idx], gy[idx], linestyle=styles[engine], color=color, linewidth=1.6, alpha=0.85)
        for pos, row in enumerate(_rows(group)):
            ax.scatter(
                gx[pos], gy[pos], marker=markers[_tp_text(row["tp"])], s=46 if pos in idx else 28, color=color,
                edgecolors="black" if pos in idx else "white", linewidths=0.7, zorder=3,
            )  # fmt: skip
            ax.annotate(
                _point_label(row), (gx[pos], gy[pos]), xytext=(4, 4), textcoords="offset points", fontsize=6.5,
                color="#333333",
            )  # fmt: skip
    ax.set_ylim(bottom=0)


MAIN_TITLE = "Output throughput per GPU against interactivity and TTFT p90"
PLOT_FILES = {
    "pareto.png": MAIN_TITLE,
    **{f"pareto_{y}.png": Y_METRICS[y] for y in Y_METRICS},
    "cache.png": "KV cache hit rates vs throughput",
    "hit_rates.png": "Ideal vs measured hit rate per cell",
    "energy.png": "GPU energy per output token vs interactivity",
    "routing.png": "Requests per engine instance over the run (routed cells)",
}


def write_plots(df: pd.DataFrame, out_dir: Path, include_invalid: bool = False) -> list[tuple[str, Path]]:
    """Every plot of the sweep; returns (title, path) in report order."""
    out: list[tuple[str, Path]] = [
        (MAIN_TITLE, main_pareto_figure(df, out_dir / "pareto.png", include_invalid))
    ]
    for y in Y_METRICS:
        out.append((Y_METRICS[y], pareto_figure(df, y, out_dir / f"pareto_{y}.png", include_invalid)))
    out.append(("KV cache hit rates vs throughput", cache_figure(df, out_dir / "cache.png", include_invalid)))
    out.append(
        (
            "Ideal vs measured hit rate per cell",
            hit_rate_figure(df, out_dir / "hit_rates.png", include_invalid),
        )
    )
    energy = energy_figure(df, out_dir / "energy.png", include_invalid)
    if energy is not None:
        out.append((PLOT_FILES["energy.png"], energy))
    routing = routing_figure(df, out_dir / "routing.png", include_invalid)
    if routing is not None:
        out.append((PLOT_FILES["routing.png"], routing))
    return out
