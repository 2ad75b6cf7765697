"""What the dashboard shows, read from the store as JSON-able values.

``index`` holds every run and point with the figures the Pareto explorer, the overlay and the history
charts plot (the history's flags are judged here, by store.query, exactly as `results history` does);
``drilldowns`` yields each point's drill-down payload, derived at ingest (store.result_files).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, select

from agentsweep import style
from agentsweep.contract import columns
from agentsweep.store import query, schema
from agentsweep.store.db import DamagedStore
from agentsweep.store.scope import SCOPE_FIELDS, VERSION_FIELDS

PERCENTILES = (("p50", "p50"), ("p90", "p90"), ("p95", "p95"), ("p99", "p99"), ("p99.9", "p999"))
# y: throughput per GPU; x: interactivity (higher is better) or TTFT / E2E (lower is better).
Y_METRICS = (
    ("total_tok_per_s_per_gpu", "Total throughput per GPU (tok/s)"),
    ("output_tok_per_s_per_gpu", "Output throughput per GPU (tok/s)"),
    ("input_tok_per_s_per_gpu", "Input throughput per GPU (tok/s)"),
)
X_MODES = (
    (
        "interactivity",
        "Interactivity: 1 / full-response ITL (tok/s per user)",
        "interactivity_{p}_tok_per_s",
        True,
    ),
    ("ttft", "TTFT (s)", "ttft_{p}_s", False),
    ("e2e", "E2E latency (s)", "e2e_{p}_s", False),
)
EXTRA_METRICS = (
    "gpu_hit_rate",
    "cpu_hit_rate",
    "requests_ok",
    "requests_failed",
    "requests_per_s",
    "clock_scale",
    "ttft_p50_s",
    "e2e_p50_s",
    "kv_usage_peak",
    "avg_power_per_gpu_w",
    "joules_per_output_token",
)
# A drill-down's own figures, in this order (each named with its unit by metric_label).
POINT_FIGURES = (
    "output_tok_per_s_per_gpu",
    "total_tok_per_s_per_gpu",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "e2e_p50_s",
    "e2e_p90_s",
    "interactivity_p50_tok_per_s",
    "interactivity_p90_tok_per_s",
    "gpu_hit_rate",
    "cpu_hit_rate",
    "kv_usage_peak",
    "requests_ok",
    "requests_failed",
    "requests_per_s",
    "avg_power_per_gpu_w",
    "joules_per_output_token",
)
_STAT = {f"p{p.replace('.', '')}": f"p{p}" for p in ("50", "75", "90", "95", "99", "99.9")} | {"mean": "mean"}
_NAMED = {
    "gpu_hit_rate": "GPU prefix-cache hit rate",
    "cpu_hit_rate": "CPU / external KV hit rate",
    "kv_usage_peak": "GPU KV cache usage, peak",
    "requests_ok": "Requests ok",
    "requests_failed": "Requests failed",
    "requests_per_s": "Requests per second",
    "clock_scale": "Engine clock speed-up",
    "avg_power_per_gpu_w": "GPU power, mean per GPU",
    "joules_per_output_token": "GPU energy per output token",
}
_UNIT_TEXT = {
    "s": "s",
    "tok/s/gpu": "tok/s",
    "tok/s/user": "tok/s per user",
    "req/s": "req/s",
    "fraction": "share",
    "count": "count",
    "factor": "×",
    "W": "W",
    "J/tok": "J",
}


def metric_label(name: str) -> str:
    """A summary.csv column as an axis or a hover names it, with its unit: ``TTFT p90 (s)``."""
    unit = columns.UNITS.get(name)
    unit_text = f" ({_UNIT_TEXT.get(str(unit), str(unit))})" if unit is not None else ""
    if name in _NAMED:
        return _NAMED[name] + unit_text
    for y, label in Y_METRICS:
        if name == y:
            return label
    for prefix, text in (("ttft_", "TTFT"), ("e2e_", "E2E latency"), ("tpot_", "TPOT"), ("itl_", "ITL")):
        stat = name.removeprefix(prefix).removesuffix("_s")
        if name.startswith(prefix) and name.endswith("_s") and stat in _STAT:
            return f"{text} {_STAT[stat]}{unit_text}"
    if name.startswith("interactivity_") and name.endswith("_tok_per_s"):
        stat = name.removeprefix("interactivity_").removesuffix("_tok_per_s")
        if stat in _STAT:
            return f"Interactivity {_STAT[stat]}: 1 / full-response ITL{unit_text}"
    return name + unit_text


HISTORY_METRICS = (*query.DIFF_METRICS, "gpu_hit_rate")


def plotted_metrics() -> list[str]:
    names = [name for name, _ in Y_METRICS]
    for _, _, template, _ in X_MODES:
        names += [template.format(p=key) for _, key in PERCENTILES]
    names += [*EXTRA_METRICS, *POINT_FIGURES, *HISTORY_METRICS]
    return list(dict.fromkeys(names))


def _history(points: list[query.Point]) -> list[dict[str, Any]]:
    """History lines per metric, grouped by the scope less its versions (history spans versions)."""
    groups: dict[str, list[query.Point]] = {}
    for point in points:
        if point.status != "SUCCESS":
            continue
        key = " ".join(
            f"{k}={point.scope[k]}" for k in SCOPE_FIELDS if k not in VERSION_FIELDS and point.scope[k]
        )
        groups.setdefault(key, []).append(point)
    out = []
    for key, members in sorted(groups.items()):
        metrics: dict[str, list[dict[str, Any]]] = {}
        for metric in HISTORY_METRICS:
            lines = []
            for line in query.history(members, metric):
                entries = []
                for point, change in zip(line.points, line.changes, strict=True):
                    entries.append(
                        {
                            "point": point.id,
                            "run": point.run.id,
                            "when": point.run.started_utc or point.run.ingested_utc,
                            "value": point.metrics.get(metric),
                            "engine_version": point.scope["engine_version"],
                            "flag": None if change is None else change.flagged,
                            "direction": "" if change is None else change.direction,
                            "change": None if change is None else change.relative,
                            "noise": "" if change is None else change.noise,
                        }
                    )
                first = line.points[0]
                label = f"{first.config_key} tp{first.position['tp']} u{first.position['users']}"
                lines.append({"label": label, "entries": entries})
            metrics[metric] = lines
        out.append({"scope": key, "metrics": metrics})
    return out


def index(conn: Connection) -> dict[str, Any]:
    runs = query.list_runs(conn)
    points = query.load_points(conn, metrics=plotted_metrics())
    return {
        "version": 1,
        "runs": [
            {
                "id": r.id,
                "label": r.label,
                "started": r.started_utc,
                "commit": r.commit,
                "points": r.points,
                "source": r.source,
            }
            for r in runs
        ],
        "points": [
            {
                "id": p.id,
                "run": p.run.id,
                "exp_name": p.exp_name,
                "config_key": p.config_key,
                "status": p.status,
                "reason": p.reason,
                "scope_key": p.scope_key,
                **p.scope,
                **p.position,
                "m": p.metrics,
            }
            for p in points
        ],
        "y_metrics": [{"key": k, "label": label} for k, label in Y_METRICS],
        "x_modes": [
            {"key": k, "label": label, "template": template, "higher_better": higher}
            for k, label, template, higher in X_MODES
        ],
        "percentiles": [{"label": label, "key": key} for label, key in PERCENTILES],
        "history_metrics": list(HISTORY_METRICS),
        "metric_labels": {name: metric_label(name) for name in plotted_metrics()},
        "point_figures": list(POINT_FIGURES),
        "style": style.for_dashboard(),
        "history": _history(points),
    }


def drilldowns(conn: Connection) -> Iterator[tuple[int, bytes]]:
    """(point id, drill-down payload as the JSON ingest wrote) for every point, one at a time."""
    b = schema.blobs
    ids = conn.execute(select(b.c.point_id).where(b.c.name == "drilldown.json").order_by(b.c.point_id))
    point_ids: list[int] = [int(row.point_id) for row in ids]
    for point_id in point_ids:
        parts = conn.execute(
            select(b.c.data).where(b.c.point_id == point_id, b.c.name == "drilldown.json").order_by(b.c.part)
        )
        try:
            raw = b"".join(zlib.decompress(bytes(row.data)) for row in parts)
        except (zlib.error, TypeError, ValueError) as err:
            raise DamagedStore(f"point {point_id}: drilldown.json does not decompress ({err})") from None
        yield int(point_id), raw
