"""What one run measured against SLO constraints: each constraint's statistic, from requests.jsonl.

The per-request figures and the direction of their percentiles are those of
``kv_cache_tester.metrics.SLO_FIGURES``. Requests of the profiling phase count (warm-up ones do not):
latencies and speeds over the successful ones, the error share over all of them. Percentiles are
``kv_cache_tester.stats.percentile`` (linear between the closest ranks, the convention of
``kv_cache_tester.metrics``), over the run's values (a float per request and figure). A simulated engine's figures are turned into its own clock (its ``speed`` undone), so tiers
read like the simulated hardware. The same function serves the capacity search (each step) and
collect (the grid-derived capacity of ordinary cells).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kv_cache_tester.metrics import SLO_FIGURES
from kv_cache_tester.replay import RecordReader, ResultError, Summary, load_summary
from kv_cache_tester.stats import percentile

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import REQUESTS_JSONL, SERVER_LOG
from agentsweep.contract.resultdir.serverlog import kv_pool_tokens
from agentsweep.contract.slo import SloConstraint


@dataclass
class RunFigures:
    """What a run measured: SLO statistics (engine clock, figure units), throughput and KV figures."""

    statistics: dict[str, float | None] = field(default_factory=dict)
    requests: int = 0  # profiled requests (sent)
    output_tok_per_s_per_gpu: float | None = None
    total_tok_per_s_per_gpu: float | None = None
    kv_working_set_tokens: int | None = None
    kv_pool_tokens: int | None = None
    problem: str = ""  # why figures are missing (an unreadable file), else empty


def statistics(
    path: Path, constraints: Sequence[SloConstraint], clock_scale: float = 1.0
) -> tuple[dict[str, float | None], int, dict[int, int]]:
    """(statistic per constraint key, profiled requests, largest context per lane) of a requests.jsonl.

    A file that cannot be opened raises ``kv_cache_tester.replay.ResultError``.
    """
    figures = {c.metric: SLO_FIGURES[c.metric] for c in constraints}
    values: dict[str, list[float]] = {name: [] for name in figures}
    requests = 0
    lane_peak: dict[int, int] = {}
    for rec in RecordReader(path, required=()):
        if rec.get("phase") == "warmup":
            continue
        requests += 1
        ok = rec.get("status") == "ok"
        for name, figure in figures.items():
            if figure.ok_only and not ok:
                continue
            value = figure.value(rec)
            if value is not None and value >= 0:
                values[name].append(value)
        if ok:
            user = rec.get("user")
            if user is not None:
                context = max(0, rec.get("prompt_tokens") or 0) + max(0, rec.get("output_tokens") or 0)
                lane_peak[user] = max(lane_peak.get(user, 0), context)
    for series in values.values():
        series.sort()
    out: dict[str, float | None] = {}
    for constraint in constraints:
        data = values[constraint.metric]
        p = constraint.percentile
        value = (math.fsum(data) / len(data) if data else None) if p is None else percentile(data, p)
        power = constraint.figure.clock_power
        out[constraint.key] = None if value is None else value * clock_scale**power
    return out, requests, lane_peak


def run_figures(
    result_dir: Path, cell: Cell, constraints: Sequence[SloConstraint], summary: Summary | None = None
) -> RunFigures:
    """The figures of one run's result directory (a step, or an ordinary cell); never raises for bad
    content: an unreadable file leaves the figures empty and says why in ``problem``. ``summary`` is
    its summary.json where the caller has read it already (else it is read here)."""
    out = RunFigures()
    try:
        out.statistics, out.requests, lane_peak = statistics(
            result_dir / REQUESTS_JSONL, constraints, cell.speed
        )
    except ResultError as err:
        out.statistics = {c.key: None for c in constraints}
        out.problem = str(err)
        return out
    out.kv_working_set_tokens = sum(lane_peak.values()) if lane_peak else None
    out.kv_pool_tokens = kv_pool_tokens(result_dir / SERVER_LOG)
    if summary is None:
        try:
            summary = load_summary(result_dir, required=())
        except ResultError as err:
            out.problem = str(err)
            return out
    throughput = summary.get("throughput") or {}
    for key, attr in (
        ("output_tok_per_s", "output_tok_per_s_per_gpu"),
        ("total_tok_per_s", "total_tok_per_s_per_gpu"),
    ):
        value = throughput.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            setattr(out, attr, value / cell.speed / cell.gpus)
    return out
