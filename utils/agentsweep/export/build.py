"""One collected cell (collect's row, in the engine's clock, and its cell) as an InferenceX row.

``nested_row`` builds the nested row from collect's columns; ``flat_row`` builds the flat row from
the same columns on its own (so that ``flatten(nested_row(...)) == flat_row(...)`` is a real check of
both). Every figure comes from collect, which computes them through kv_cache_tester.metrics; nothing
here defines a metric again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kv_cache_tester.metrics import finite, interactivity_tok_s
from kv_cache_tester.replay import Window
from pydantic import BaseModel

from agentsweep.contract.cell import Cell
from agentsweep.contract.columns import LATENCY_STATS
from agentsweep.contract.hardware import LEGACY_SIM_HARDWARE
from agentsweep.energy.summary import REASON_CODES
from agentsweep.export.inferencex import hardware, model_prefix
from agentsweep.export.models import (
    FLAT_METRICS,
    POWER_FIGURES,
    POWER_METRIC_SCHEMA_VERSION,
    SAME_NAMED_POWER,
    STABILITY_COUNTS,
    STABILITY_KEYS,
    STATS,
    WINDOW_RANGES,
    FlatRow,
    KvCache,
    Latency,
    NestedRow,
    ObservedRanges,
    Outcome,
    PerGpu,
    RequestAccounting,
    RequestCache,
    RequestMetrics,
    Router,
    ServerCache,
    ServerMetrics,
    Stability,
    Statistics,
    Throughput,
    Tokens,
)
from agentsweep.export.models import Rate as RateModel

# The raw sibling artifact's copy of power.csv, named in each row's power audit.
POWER_SOURCE = "power.csv"


@dataclass(frozen=True)
class Point:
    """What one exported row is made of: collect's row values, the parsed cell, its versions, the
    failed requests per error class (summary.json's, as ``CellResult.failed_by_class`` reads them) and
    summary.json's window (``CellResult.summary``; None for a FAILED cell, which holds no summary)."""

    exp_name: str
    outcome: Outcome
    cell: Cell
    values: Mapping[str, Any]
    versions: Mapping[str, str | None]
    reason: str = ""  # why the cell is not SUCCESS (collect's reason)
    failed_by_class: Mapping[str, int] = field(default_factory=dict)
    window: Window | None = None


def _int(value: Any) -> int | None:
    number = finite(value)
    return None if number is None else round(number)


def _col(stat: str) -> str:
    return stat.replace(".", "")


def _latency(values: Mapping[str, Any], metric: str) -> Statistics:
    """A latency's statistics from collect's ``{metric}_{stat}_s`` columns."""
    return Statistics.model_validate({s: finite(values.get(f"{metric}_{_col(s)}_s")) for s in LATENCY_STATS})


def _interactivity(values: Mapping[str, Any]) -> Statistics:
    """1 / full-response ITL at each statistic (collect's interactivity columns)."""
    return Statistics.model_validate(
        {s: finite(values.get(f"interactivity_{_col(s)}_tok_per_s")) for s in LATENCY_STATS}
    )


def _e2e_norm_interactivity(values: Mapping[str, Any]) -> Statistics:
    """1 / E2E per output token at each statistic (collect's E2E-normalised interactivity columns)."""
    return Statistics.model_validate(
        {s: finite(values.get(f"e2e_norm_interactivity_{_col(s)}_tok_per_s")) for s in LATENCY_STATS}
    )


def _token_gap_interactivity(values: Mapping[str, Any]) -> Statistics:
    """1 / token-gap ITL at each statistic; no std (the token gaps are not per-request speeds)."""
    figures = {s: interactivity_tok_s(finite(values.get(f"itl_{_col(s)}_s"))) for s in LATENCY_STATS}
    figures["std"] = None
    return Statistics.model_validate(figures)


def _scale(values: Mapping[str, Any]) -> float:
    return finite(values.get("clock_scale")) or 1.0


def _duration(values: Mapping[str, Any]) -> float | None:
    window = finite(values.get("window_s"))
    return None if window is None else window * _scale(values)


def _tokens(values: Mapping[str, Any], rate_column: str) -> int | None:
    """A server counter's growth over the window: its rate times the window (both in one clock)."""
    rate, duration = finite(values.get(rate_column)), _duration(values)
    return None if rate is None or duration is None else round(rate * duration)


def _json(text: Any, default: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) and text else default
    except ValueError:
        return default


def _stability(values: Mapping[str, Any], flat: str) -> float | int | None:
    if flat == "observed_window_seconds":
        subwindow = finite(values.get("stability_subwindow_s"))
        return None if subwindow is None else subwindow * _scale(values)
    nested = dict(STABILITY_KEYS)[flat]
    value = values.get(f"stability_{nested}")
    return _int(value) if flat in STABILITY_COUNTS else finite(value)


def _window_range(values: Mapping[str, Any], metric: str, stat: str, end: str) -> float | None:
    return finite(values.get(f"stability_{stat}_{metric}_{end}"))


def _deviations(values: Mapping[str, Any]) -> list[str]:
    """Where the run departs from its replay preset (summary.json ``preset.deviations``)."""
    found = _json(values.get("preset_deviations"), [])
    return [str(d) for d in found] if isinstance(found, list) else []


def _outcome(point: Point) -> dict[str, Any]:
    reasons = [r.strip() for r in point.reason.split(";") if r.strip()] if point.outcome != "SUCCESS" else []
    return {
        "status": "passed" if point.outcome == "SUCCESS" else "failed",
        "verdict": point.outcome,
        "reasons": reasons,
        "failed_requests": _int(point.values.get("requests_failed")),
    }


def _power(point: Point) -> dict[str, Any]:
    """The power keys under InferenceX's power contract (schema 2), from collect's power columns (never
    computed again here); empty when the cell's runner samples no power."""
    v, cell = point.values, point.cell
    valid = v.get("power_valid")
    if cell.node.power_source == "none" or not isinstance(valid, bool):
        return {}
    audit = _json(v.get("power_audit"), {})
    codes = [c for c in _json(v.get("power_reason_codes"), []) if c in REASON_CODES]
    gpus = cell.gpus
    p90_total = finite(v.get("p90_power_w"))
    figures = {
        "avg_power_w": finite(v.get("avg_power_per_gpu_w")),
        "avg_total_gpu_power_w": finite(v.get("avg_power_w")),
        "p90_power_w": None if p90_total is None else p90_total / gpus,
        "p90_total_gpu_power_w": p90_total,
        **{name: finite(v.get(name)) for name in SAME_NAMED_POWER},
    }
    return {
        "power_metric_schema_version": POWER_METRIC_SCHEMA_VERSION,
        "power_valid": 1 if valid else 0,
        **{name: (figures[name] if valid else None) for name in POWER_FIGURES},
        "power_invalid_reasons": list(dict.fromkeys(codes)),
        "power_audit": {
            "source": POWER_SOURCE,
            "window_start_unix": finite(audit.get("window_start_unix")),
            "window_end_unix": finite(audit.get("window_end_unix")),
            "expected_gpu_count": _int(audit.get("expected_gpus")) or 0,
            "observed_gpu_count": _int(audit.get("observed_gpus")) or 0,
            "sample_count": _int(audit.get("samples")) or 0,
            "max_sample_gap_s": finite(audit.get("largest_gap_s")),
            "reasons": [str(r) for r in _json(v.get("power_reasons"), [])],
        },
    }


def identity(point: Point) -> dict[str, Any]:
    """The fields both shapes share."""
    cell, values = point.cell, point.values
    on = cell.offload == "on"
    out: dict[str, Any] = {
        "exp_name": point.exp_name,
        "outcome": point.outcome,
        "benchmark_outcome": _outcome(point),
        "infmax_model_prefix": model_prefix(cell),
        "hw": hardware(cell, LEGACY_SIM_HARDWARE),
        "simulated": cell.engine == "sim",
        "conc": cell.users,
        "users": cell.users,
        "image": cell.image,
        "model": cell.model,
        "framework": cell.engine,
        "precision": cell.precision,
        "tp": cell.tp,
        "ep": cell.ep,
        "dp_attention": "false",
        "disagg": cell.disaggregated,
        "is_multinode": cell.nodes > 1,
        "num_gpus": cell.gpus,
        "offload_mode": "on" if on else "off",
        "prefix_caching": "false" if cell.offload == "noprefix" else "true",
        "kv_offload_backend": cell.offload_connector if on else "none",
        "allocated_cpu_dram_gb": float(cell.cpu_dram_gb) if on else 0.0,
        "recipe_fingerprint": values.get("recipe_fingerprint") or None,
        "num_requests_total": _int(values.get("req_records")),
        "num_requests_successful": _int(values.get("requests_ok")),
        "duration_seconds": _duration(values),
        "replay_preset": {"name": cell.replay.preset, "deviations": _deviations(values)},
        "kv_cache_pool_tokens": _int(values.get("kv_pool_tokens")),
    }
    if cell.prefill is not None and cell.decode is not None:
        out.update(
            prefill_num_workers=cell.prefill.replicas,
            prefill_tp=cell.prefill.tp,
            prefill_ep=cell.ep,
            prefill_dp_attention="false",
            num_prefill_gpu=cell.prefill.gpus,
            decode_num_workers=cell.decode.replicas,
            decode_tp=cell.decode.tp,
            decode_ep=cell.ep,
            decode_dp_attention="false",
            num_decode_gpu=cell.decode.gpus,
        )
    out.update(_power(point))
    return out


def nested_row(point: Point) -> NestedRow:
    """The nested row of one point."""
    v = point.values
    gpu_hit, cpu_hit = finite(v.get("gpu_hit_rate")), finite(v.get("cpu_hit_rate"))
    router_name = point.cell.router_program if point.cell.routed else None
    full_itl, full_intvty = _latency(v, "full_response_itl"), _interactivity(v)
    ranges: dict[str, Any] = {}
    for metric, stat, end in WINDOW_RANGES:
        ranges.setdefault(metric, {}).setdefault(stat, {})[end] = _window_range(v, metric, stat, end)
    return NestedRow.model_validate(
        {
            **identity(point),
            "request_metrics": RequestMetrics(
                latency=Latency(
                    ttft=_latency(v, "ttft"),
                    e2el=_latency(v, "e2e"),
                    itl=full_itl,
                    tpot=_latency(v, "tpot"),
                    intvty=full_intvty,
                    full_response_itl=full_itl,
                    full_response_intvty=full_intvty,
                    e2e_norm_intvty=_e2e_norm_interactivity(v),
                    token_gap_itl=_latency(v, "itl"),
                    token_gap_intvty=_token_gap_interactivity(v),
                ),
                throughput=Throughput(
                    input=RateModel(tokens_per_second=finite(v.get("input_tok_per_s"))),
                    output=RateModel(tokens_per_second=finite(v.get("output_tok_per_s"))),
                    total=RateModel(tokens_per_second=finite(v.get("total_tok_per_s"))),
                    duration_seconds=_duration(v),
                    per_gpu=PerGpu(
                        total_tput_tps=finite(v.get("total_tok_per_s_per_gpu")),
                        output_tput_tps=finite(v.get("output_tok_per_s_per_gpu")),
                        input_tput_tps=finite(v.get("input_tok_per_s_per_gpu")),
                    ),
                ),
                cache=RequestCache(theoretical_cache_hit_rate=finite(v.get("theoretical_hit_rate"))),
                stability=Stability.model_validate(
                    {
                        **{nested: _stability(v, flat) for flat, nested in STABILITY_KEYS},
                        "observed_ranges": ObservedRanges.model_validate(ranges),
                    }
                ),
            ),
            "server_metrics": ServerMetrics(
                cache=ServerCache(
                    gpu_cache_hit_rate=gpu_hit,
                    cpu_cache_hit_rate=cpu_hit,
                    overall_cache_hit_rate=None if gpu_hit is None else gpu_hit + (cpu_hit or 0.0),
                ),
                kv_cache=KvCache(
                    gpu_usage_pct=finite(v.get("kv_usage_peak")),
                    gpu_total_tokens=_int(v.get("kv_pool_tokens")),
                ),
                tokens=Tokens(
                    prompt_total=_tokens(v, "server_prompt_tok_per_s"),
                    generation_total=_tokens(v, "server_generation_tok_per_s"),
                    requests_completed=_int(v.get("requests_ok")),
                ),
            ),
            "request_accounting": RequestAccounting(
                records_total=_int(v.get("req_records")),
                records_profiled=_int(v.get("requests_sent")),
                records_warmup_dropped=_int(v.get("requests_warmup")),
                records_error_dropped=_int(v.get("requests_failed")),
                error_categories=dict(point.failed_by_class),
            ),
            "router": Router(name=router_name, version=point.versions.get("router") if router_name else None),
        }
    )


def flat_row(point: Point) -> BaseModel:
    """The flat row of one point, from collect's columns directly."""
    v = point.values
    out: dict[str, Any] = identity(point)
    sources = {
        "ttft": lambda s: finite(v.get(f"ttft_{s}_s")),
        "e2el": lambda s: finite(v.get(f"e2e_{s}_s")),
        "itl": lambda s: finite(v.get(f"full_response_itl_{s}_s")),
        "tpot": lambda s: finite(v.get(f"tpot_{s}_s")),
        "intvty": lambda s: finite(v.get(f"interactivity_{s}_tok_per_s")),
    }
    sources["full_response_itl"] = sources["itl"]
    sources["full_response_intvty"] = sources["intvty"]
    sources["e2e_norm_intvty"] = lambda s: finite(v.get(f"e2e_norm_interactivity_{s}_tok_per_s"))
    for metric, _ in FLAT_METRICS:
        for prefix, key in STATS:
            out[f"{prefix}_{metric}"] = sources[metric](_col(key))
    out.update(
        input_tput_tps=finite(v.get("input_tok_per_s")),
        output_tput_tps=finite(v.get("output_tok_per_s")),
        total_tput_tps=finite(v.get("total_tok_per_s")),
        tput_per_gpu=finite(v.get("total_tok_per_s_per_gpu")),
        output_tput_per_gpu=finite(v.get("output_tok_per_s_per_gpu")),
        input_tput_per_gpu=finite(v.get("input_tok_per_s_per_gpu")),
        theoretical_cache_hit_rate=finite(v.get("theoretical_hit_rate")),
        server_gpu_cache_hit_rate=finite(v.get("gpu_hit_rate")),
        server_cpu_cache_hit_rate=finite(v.get("cpu_hit_rate")),
        gpu_kv_cache_usage_pct=finite(v.get("kv_usage_peak")),
        total_prompt_tokens=_tokens(v, "server_prompt_tok_per_s"),
        total_generation_tokens=_tokens(v, "server_generation_tok_per_s"),
        total_requests_completed=_int(v.get("requests_ok")),
    )
    for flat, _ in STABILITY_KEYS:
        out[flat] = _stability(v, flat)
    for metric, stat, end in WINDOW_RANGES:
        out[f"observed_window_{stat}_{metric}_{end}"] = _window_range(v, metric, stat, end)
    return FlatRow.model_validate(out)
