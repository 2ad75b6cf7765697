"""A cell's figures as summary.csv names them (contract.columns), read from the replayer's summary: the
one place that reads summary.json by its dotted paths, puts a simulated cell on its engine's clock and
derives the per-GPU and interactivity figures. collect builds its rows with it, and a finished cell
prints its progress line with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kv_cache_tester.metrics import finite, interactivity_tok_s, per_gpu
from kv_cache_tester.replay import Summary

from agentsweep.contract import columns
from agentsweep.contract.columns import (
    ENGINE_CLOCK,
    INTERACTIVITY_STATS,
    PLAIN_INTERACTIVITY_STATS,
    THROUGHPUTS,
    Unit,
)

# One figure as summary.csv holds it: a number, a flag (columns.Unit.FLAG), a label or compact JSON
# (Unit.LABEL, Unit.JSON), or None where the cell has none. A row's figures, and the cell's own fields
# beside them, are a ``Figures``: flat by construction, so rendering a table of them is a copy.
Figure = int | float | bool | str | None
Figures = dict[str, Figure]


def flat(value: object) -> Figure:
    """Cell values stay scalar in the CSV; anything nested becomes compact JSON."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _at(doc: Any, path: str) -> Any:
    """The value at a dotted path of summary.json (a last key may hold a dot: "p99.9"); None when
    any part is absent."""
    node = doc
    while isinstance(node, dict):
        if path in node:
            return node[path]
        head, dot, path = path.partition(".")
        if not dot:
            return None
        node = node.get(head)
    return None


def summary_columns(summary: Summary) -> Figures:
    """The replayer's summary as summary.csv columns (columns.SUMMARY)."""
    out: Figures = {}
    for column in columns.SUMMARY:
        assert column.source is not None
        value = _at(summary, column.source)
        if column.unit is Unit.JSON:
            out[column.name] = flat(value or {})
        elif column.unit is Unit.LABEL:
            out[column.name] = value if isinstance(value, str) else None
        else:
            out[column.name] = finite(value)
    window = summary["window"]
    out["window_s"] = out["window_s"] or window["end_unix"] - window["start_unix"]
    return out


def derived_columns(values: Mapping[str, Figure], gpus: float | None) -> Figures:
    """Per-GPU throughput (every GPU of the cell) and interactivity (tokens/s per user): ``1 / ITL`` at
    each statistic of the full-response ITL, and of the plain ITL (kv_cache_tester.metrics).

    A summary written before the full-response ITL was in it gives the same figure from TPOT (per
    request, TPOT is the full-response ITL: ``(E2E - TTFT) / (output tokens - 1)``).
    """
    out: Figures = {}
    for key in THROUGHPUTS:
        out[f"{key}_per_gpu"] = per_gpu(finite(values.get(key)), gpus)
    for stat in INTERACTIVITY_STATS:
        if stat == "std":
            continue
        name = stat.replace(".", "")
        itl = values.get(f"full_response_itl_{name}_s")
        if itl is None:
            itl = values.get(f"tpot_{name}_s")
        out[f"interactivity_{name}_tok_per_s"] = interactivity_tok_s(finite(itl))
    for stat in PLAIN_INTERACTIVITY_STATS:
        itl = values.get(f"itl_{stat}_s")
        out[f"plain_interactivity_{stat}_tok_per_s"] = interactivity_tok_s(finite(itl))
    return out


def engine_clock_columns(summary: Summary) -> tuple[Figures, Figures]:
    """A simulated cell's figures in the engine's own clock (summary.json ``engine_clock``).

    Returns (beside, engine): ``beside`` are the columns.ENGINE_CLOCK_COLUMNS (the client's wall-clock
    latencies, rescaled with the rest by ``to_engine_clock``, and the gap), to add before rescaling;
    ``engine`` are the summary's latency and throughput columns as the engine's timelines give them,
    to put over the rescaled client figures afterwards. Both empty-handed for a cell without
    timelines (every real engine): ``latency_clock`` stays empty and nothing is replaced.
    """
    engine_clock = summary.get("engine_clock")
    if engine_clock is None:
        return {}, {}
    beside: Figures = {"latency_clock": "engine"}
    for column in columns.ENGINE_CLOCK_COLUMNS[1:]:
        assert column.source is not None
        beside[column.name] = finite(_at(summary, column.source))
    engine: Figures = {}
    for column in columns.SUMMARY:
        source = column.source or ""
        if source.startswith(("latency.", "throughput.")):
            engine[column.name] = finite(_at(engine_clock, source))
    return beside, engine


def to_engine_clock(values: Figures, speed: float | None) -> None:
    """Express a sped-up simulated cell's figures in the engine's own clock, in place.

    A simulated engine with ``speed`` S runs S times faster than the wall clock the replayer and the
    scraper measure, so latencies (unit s) are multiplied by S and rates (per second) divided by S:
    the table then reads like the simulated hardware. Wall-time lengths (the window, the client's
    dispatch lag, scrape gaps) stay. ``clock_scale`` records S (1 for every real engine). The client's
    own overhead is inside the latencies, so at high S small latencies carry S times its error.
    """
    speed = speed or 1.0
    values["clock_scale"] = speed
    if speed == 1.0:
        return
    for column in columns.METRICS:
        power = ENGINE_CLOCK.get(column.unit)
        value = values.get(column.name)
        if power is None or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        values[column.name] = value * speed if power > 0 else value / speed


def summary_figures(summary: Summary, *, gpus: int, speed: float) -> Figures:
    """The summary's own figures for a cell of ``gpus`` GPUs run at ``speed``, in the engine's clock,
    with the derived ones: what collect's row holds before it adds the server's, the records' and the
    power figures."""
    values = summary_columns(summary)
    beside, engine = engine_clock_columns(summary)
    values.update(beside)
    to_engine_clock(values, speed)
    values.update(engine)
    values.update(derived_columns(values, gpus))
    return values
