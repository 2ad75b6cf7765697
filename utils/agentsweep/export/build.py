"""One collected cell (collect's row, in the engine's clock, and its cell) as an InferenceX row.

``nested_row`` builds the agentx-v1 row from collect's columns; ``flat_row`` builds the flat row from
the same columns on its own (so that ``flatten(nested_row(...)) == flat_row(...)`` is a real check of
both). Every figure comes from collect, which computes them through kv_cache_tester.metrics; nothing
here defines a metric again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kv_cache_tester.metrics import interactivity_tok_s
from pydantic import BaseModel

from agentsweep.collect.columns import LATENCY_STATS
from agentsweep.contract.cell import Cell
from agentsweep.export.models import (
    FLAT_METRICS,
    POWER_FIGURES,
    STABILITY_KEYS,
    STATS,
    FlatRow,
    KvCache,
    Latency,
    NestedRow,
    Outcome,
    PerGpu,
    Power,
    Rate,
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


@dataclass(frozen=True)
class Point:
    """What one exported row is made of: collect's row values, the parsed cell, its versions."""

    exp_name: str
    outcome: Outcome
    cell: Cell
    values: Mapping[str, Any]
    versions: Mapping[str, str | None]


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    number = _num(value)
    return None if number is None else round(number)


def _col(stat: str) -> str:
    return stat.replace(".", "")


def _latency(values: Mapping[str, Any], metric: str) -> Statistics:
    """A latency's statistics from collect's ``{metric}_{stat}_s`` columns."""
    return Statistics.model_validate({s: _num(values.get(f"{metric}_{_col(s)}_s")) for s in LATENCY_STATS})


def _interactivity(values: Mapping[str, Any]) -> Statistics:
    """1 / full-response ITL at each statistic (collect's interactivity columns)."""
    return Statistics.model_validate(
        {s: _num(values.get(f"interactivity_{_col(s)}_tok_per_s")) for s in LATENCY_STATS}
    )


def _plain_interactivity(values: Mapping[str, Any]) -> Statistics:
    """1 / plain ITL at each statistic; no std (the token gaps are not per-request speeds)."""
    figures = {s: interactivity_tok_s(_num(values.get(f"itl_{_col(s)}_s"))) for s in LATENCY_STATS}
    figures["std"] = None
    return Statistics.model_validate(figures)


def _duration(values: Mapping[str, Any]) -> float | None:
    window, scale = _num(values.get("window_s")), _num(values.get("clock_scale")) or 1.0
    return None if window is None else window * scale


def _tokens(values: Mapping[str, Any], rate_column: str) -> int | None:
    """A server counter's growth over the window: its rate times the window (both in one clock)."""
    rate, duration = _num(values.get(rate_column)), _duration(values)
    return None if rate is None or duration is None else round(rate * duration)


def _error_categories(values: Mapping[str, Any]) -> dict[str, int]:
    text = values.get("failed_by_class")
    try:
        data = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        data = {}
    return {str(k): int(v) for k, v in data.items() if isinstance(v, int)} if isinstance(data, dict) else {}


def identity(point: Point) -> dict[str, Any]:
    """The fields both shapes share."""
    cell, values = point.cell, point.values
    on = cell.offload == "on"
    out: dict[str, Any] = {
        "exp_name": point.exp_name,
        "outcome": point.outcome,
        "hw": cell.hardware or cell.runner,
        "hw_simulated": cell.simulated,
        "conc": cell.users,
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
    }
    if cell.prefill is not None and cell.decode is not None:
        out.update(
            prefill_num_workers=cell.prefill.replicas,
            prefill_tp=cell.prefill.tp,
            prefill_ep=cell.ep,
            num_prefill_gpu=cell.prefill.gpus,
            decode_num_workers=cell.decode.replicas,
            decode_tp=cell.decode.tp,
            decode_ep=cell.ep,
            num_decode_gpu=cell.decode.gpus,
        )
    return out


def _stability_value(values: Mapping[str, Any], key: str) -> float | int | None:
    value = values.get(
        f"stability_{key.removeprefix('observed_window_') if key.startswith('observed_window_p') else key}"
    )
    return _int(value) if key.endswith("_count") and "kish" not in key else _num(value)


def _power_verdict(point: Point) -> tuple[bool, list[str], dict[str, Any]] | None:
    """collect's power verdict, reasons and audit of the cell (its ``power_*`` columns, never computed
    again here); None when the cell's runner samples no power or collect gave no power columns."""
    v = point.values
    valid = v.get("power_valid")
    if point.cell.power_source == "none" or not isinstance(valid, bool):
        return None
    reasons, audit = json.loads(v.get("power_reasons") or "[]"), json.loads(v.get("power_audit") or "{}")
    return valid, [str(reason) for reason in reasons], audit


def _power(point: Point) -> Power | None:
    verdict = _power_verdict(point)
    if verdict is None:
        return None
    valid, reasons, audit = verdict
    figures = {name: _num(point.values.get(name)) for name in POWER_FIGURES}
    return Power.model_validate({"valid": valid, **figures, "reasons": reasons, "audit": audit})


def nested_row(point: Point) -> NestedRow:
    """The agentx-v1 row of one point."""
    v = point.values
    gpu_hit, cpu_hit = _num(v.get("gpu_hit_rate")), _num(v.get("cpu_hit_rate"))
    usage = _num(v.get("kv_usage_mean"))
    scale = _num(v.get("clock_scale")) or 1.0
    subwindow = _num(v.get("stability_subwindow_s"))
    router_name = point.cell.router_program if point.cell.routed else None
    return NestedRow.model_validate(
        {
            **identity(point),
            "request_metrics": RequestMetrics(
                latency=Latency(
                    ttft=_latency(v, "ttft"),
                    e2el=_latency(v, "e2e"),
                    itl=_latency(v, "itl"),
                    tpot=_latency(v, "tpot"),
                    intvty=_plain_interactivity(v),
                    full_response_itl=_latency(v, "full_response_itl"),
                    full_response_intvty=_interactivity(v),
                ),
                throughput=Throughput(
                    input=Rate(tokens_per_second=_num(v.get("input_tok_per_s"))),
                    output=Rate(tokens_per_second=_num(v.get("output_tok_per_s"))),
                    total=Rate(tokens_per_second=_num(v.get("total_tok_per_s"))),
                    per_gpu=PerGpu(
                        total_tput_tps=_num(v.get("total_tok_per_s_per_gpu")),
                        output_tput_tps=_num(v.get("output_tok_per_s_per_gpu")),
                        input_tput_tps=_num(v.get("input_tok_per_s_per_gpu")),
                    ),
                ),
                cache=RequestCache(theoretical_cache_hit_rate=_num(v.get("theoretical_hit_rate"))),
                stability=Stability(
                    observed_window_count=_int(v.get("stability_observed_window_count")),
                    expected_window_count=_int(v.get("stability_expected_window_count")),
                    subwindow_seconds=None if subwindow is None else subwindow * scale,
                    root_trajectory_count=_int(v.get("stability_root_trajectory_count")),
                    root_trajectory_kish_effective_count=_num(
                        v.get("stability_root_trajectory_kish_effective_count")
                    ),
                    root_trajectory_largest_share=_num(v.get("stability_root_trajectory_largest_share")),
                    windows={
                        key: _stability_value(v, key)
                        for key in STABILITY_KEYS
                        if key.startswith("observed_window_p")
                    },
                ),
            ),
            "server_metrics": ServerMetrics(
                cache=ServerCache(
                    gpu_cache_hit_rate=gpu_hit,
                    cpu_cache_hit_rate=cpu_hit,
                    overall_cache_hit_rate=None if gpu_hit is None else gpu_hit + (cpu_hit or 0.0),
                ),
                kv_cache=KvCache(
                    gpu_usage_pct=None if usage is None else usage * 100.0,
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
                error_categories=_error_categories(v),
            ),
            "router": Router(name=router_name, version=point.versions.get("router") if router_name else None),
            "kv_cache_pool_tokens": _int(v.get("kv_pool_tokens")),
            "power": _power(point),
        }
    )


def flat_row(point: Point) -> BaseModel:
    """The flat row of one point, from collect's columns directly."""
    v = point.values
    out: dict[str, Any] = identity(point)
    sources = {
        "ttft": lambda s: _num(v.get(f"ttft_{s}_s")),
        "e2el": lambda s: _num(v.get(f"e2e_{s}_s")),
        "itl": lambda s: _num(v.get(f"full_response_itl_{s}_s")),
        "tpot": lambda s: _num(v.get(f"tpot_{s}_s")),
        "intvty": lambda s: _num(v.get(f"interactivity_{s}_tok_per_s")),
    }
    for metric, _ in FLAT_METRICS:
        for prefix, key in STATS:
            out[f"{prefix}_{metric}"] = sources[metric](_col(key))
    usage = _num(v.get("kv_usage_mean"))
    out.update(
        input_tput_tps=_num(v.get("input_tok_per_s")),
        output_tput_tps=_num(v.get("output_tok_per_s")),
        total_tput_tps=_num(v.get("total_tok_per_s")),
        tput_per_gpu=_num(v.get("total_tok_per_s_per_gpu")),
        output_tput_per_gpu=_num(v.get("output_tok_per_s_per_gpu")),
        input_tput_per_gpu=_num(v.get("input_tok_per_s_per_gpu")),
        theoretical_cache_hit_rate=_num(v.get("theoretical_hit_rate")),
        server_gpu_cache_hit_rate=_num(v.get("gpu_hit_rate")),
        server_cpu_cache_hit_rate=_num(v.get("cpu_hit_rate")),
        gpu_kv_cache_usage_pct=None if usage is None else usage * 100.0,
        total_prompt_tokens=_tokens(v, "server_prompt_tok_per_s"),
        total_generation_tokens=_tokens(v, "server_generation_tok_per_s"),
        total_requests_completed=_int(v.get("requests_ok")),
    )
    for key in STABILITY_KEYS:
        out[key] = _stability_value(v, key)
    verdict = _power_verdict(point)
    valid, reasons, audit = verdict if verdict is not None else (None, None, None)
    out.update(power_valid=valid, power_reasons=reasons, power_audit=audit)
    for name in POWER_FIGURES:
        out[name] = None if verdict is None else _num(v.get(name))
    return FlatRow.model_validate(out)
