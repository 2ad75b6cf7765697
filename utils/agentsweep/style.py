"""How every chart draws a point, defined once: one colour per offload mode, one marker per TP.

The report's PNGs (matplotlib marker codes) and the dashboard's Plotly traces (Plotly symbol names,
handed to the page in its index) read these tables, so a TP 2 point with offload on looks the same in
both, whichever other points a chart holds. A TP outside ``TP_MARKERS`` takes one of ``OTHER_MARKERS``
chosen by its value, never by its position in a chart.
"""

from __future__ import annotations

import math
from typing import Any

OFFLOAD_COLORS: dict[str, str] = {"on": "#0f8b6d", "off": "#e07a1f", "noprefix": "#6a5acd"}
OFFLOAD_NAMES: dict[str, str] = {
    "on": "offload on (CPU KV tier)",
    "off": "offload off (GPU prefix cache)",
    "noprefix": "no prefix caching",
}
OTHER_COLOR = "#777777"
INVALID_COLOR = "#9a9a9a"
# Colours of routed series (offload × router policy × disaggregation shape), apart from the offload ones.
ROUTED_COLORS: tuple[str, ...] = (
    "#1f77b4",
    "#d62728",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#393b79",
    "#ad494a",
    "#637939",
    "#7b4173",
)

# TP -> (matplotlib marker, Plotly symbol).
TP_MARKERS: dict[int, tuple[str, str]] = {
    1: ("o", "circle"),
    2: ("s", "square"),
    4: ("^", "triangle-up"),
    8: ("D", "diamond"),
    16: ("v", "triangle-down"),
    32: ("P", "cross"),
    64: ("X", "x"),
}
OTHER_MARKERS: tuple[tuple[str, str], ...] = (
    ("*", "star"),
    ("h", "hexagon"),
    ("p", "pentagon"),
    ("<", "triangle-left"),
    (">", "triangle-right"),
)


def offload_color(offload: str) -> str:
    return OFFLOAD_COLORS.get(offload, OTHER_COLOR)


def _tp(value: Any) -> int | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) and number.is_integer() and number > 0 else None


def tp_marker(tp: Any) -> tuple[str, str]:
    """(matplotlib marker, Plotly symbol) of a TP; an unreadable TP takes the first of OTHER_MARKERS."""
    value = _tp(tp)
    if value is None:
        return OTHER_MARKERS[0]
    return TP_MARKERS.get(value) or OTHER_MARKERS[value % len(OTHER_MARKERS)]


def for_dashboard() -> dict[str, Any]:
    """The tables as the dashboard's index carries them (app.js draws with these and nothing else)."""
    return {
        "offload_colors": OFFLOAD_COLORS,
        "offload_names": OFFLOAD_NAMES,
        "other_color": OTHER_COLOR,
        "invalid_color": INVALID_COLOR,
        "routed_colors": list(ROUTED_COLORS),
        "tp_symbols": {str(tp): symbol for tp, (_m, symbol) in TP_MARKERS.items()},
        "other_symbols": [symbol for _m, symbol in OTHER_MARKERS],
    }
