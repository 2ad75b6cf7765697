"""Per capacity cell, one figure: each constraint's statistic against users, with its SLO lines, the
steps (hollow grey where a step was not valid), the smoothed (isotonic) curve the search read, and
each tier's boundary.

Uses matplotlib's object API (no pyplot state), as collect's other plots do.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from agentsweep.capacity.search import points_of, smoothed
from agentsweep.collect.capacity import CapacityCell
from agentsweep.collect.output import save_figure
from agentsweep.collect.plots import DPI, TITLE_Y
from agentsweep.style import INVALID_COLOR

TIER_COLORS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
STEP_COLOR = "#333333"
# A figure's unit as an axis says it.
UNIT_TEXT = {"s": "s", "tok/s": "tok/s per user", "share": "share of requests"}
SMOOTH_COLOR = "#0f8b6d"


def capacity_plot_name(exp_name: str) -> str:
    return f"capacity_{exp_name}.png"


def capacity_figure(item: CapacityCell, path: Path) -> Path:
    """The figure of one capacity cell, written to ``path``."""
    spec = item.cell.capacity
    assert spec is not None
    constraints = spec.constraints
    steps = list(item.record.steps)
    points = points_of(steps)
    colors = {tier.name: TIER_COLORS[i % len(TIER_COLORS)] for i, tier in enumerate(spec.tiers)}
    fig = Figure(figsize=(6.4 * min(len(constraints), 3), 4.6 * math.ceil(len(constraints) / 3)), dpi=DPI)
    columns = min(len(constraints), 3)
    rows = math.ceil(len(constraints) / columns)
    for k, constraint in enumerate(constraints):
        ax = fig.add_subplot(rows, columns, k + 1)
        valid = [
            (s.users, v) for s in steps if s.valid and (v := s.statistics.get(constraint.key)) is not None
        ]
        invalid = [
            (s.users, v) for s in steps if not s.valid and (v := s.statistics.get(constraint.key)) is not None
        ]
        if valid:
            ax.scatter(
                [u for u, _v in valid], [v for _u, v in valid], color=STEP_COLOR, s=28, zorder=3, label="step"
            )
        if invalid:
            ax.scatter(
                [u for u, _v in invalid],
                [v for _u, v in invalid],
                facecolors="none",
                edgecolors=INVALID_COLOR,
                s=36,
                zorder=3,
                label="step not valid",
            )
        fit = smoothed(constraint, points)
        if fit:
            xs = sorted(fit)
            ax.plot(xs, [fit[x] for x in xs], color=SMOOTH_COLOR, linewidth=1.4, label="smoothed", zorder=2)
        values = [v for _u, v in valid + invalid if v > 0]
        for tier in spec.tiers:
            for own in tier.constraints:
                if own.key == constraint.key:
                    ax.axhline(own.threshold, color=colors[tier.name], linestyle="--", linewidth=1.1,
                               label=f"{tier.name}: {own.describe()}")  # fmt: skip
                    values.append(own.threshold)
        for result in item.record.tiers:
            if result.boundary_users and result.boundary_type in ("smooth", "cliff", "unresolved"):
                ax.axvline(result.boundary_users, color=colors.get(result.tier, "#777777"), linestyle=":",
                           linewidth=1.2, label=f"{result.tier} boundary ({result.boundary_type})")  # fmt: skip
        positive = [v for v in values if v > 0]
        if positive and max(positive) / min(positive) > 30:
            ax.set_yscale("log")  # plain labels at 1, 2, 5 of each decade, not only 10^n
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("concurrent users (agents)")
        ax.set_ylabel(
            f"{constraint.statistic_label} ({UNIT_TEXT.get(constraint.figure.unit, constraint.figure.unit)})"
        )
        ax.set_title(f"{constraint.statistic_label} vs concurrent users", fontsize=10, y=TITLE_Y)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"{item.exp_name}: SLO statistics over the search ({len(steps)} steps)", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, path)


def write_capacity_plots(cells: list[CapacityCell], out_dir: Path) -> list[tuple[str, Path]]:
    """One figure per capacity cell with steps; (title, path) in table order."""
    out = []
    for item in cells:
        if not item.record.steps:
            continue
        path = capacity_figure(item, out_dir / capacity_plot_name(item.exp_name))
        out.append((f"Capacity search of {item.exp_name}: constraints vs users", path))
    return out
