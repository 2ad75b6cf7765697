"""One collected cell (collect's row, in the engine's clock, and its cell) as an InferenceX row.

``nested_row`` builds the nested row from collect's columns; ``flat_row`` builds the flat row from
the same columns on its own (so that ``flatten(nested_row(...)) == flat_row(...)`` is a real check of
both). Every figure comes from collect, which computes them through kv_cache_tester.metrics; nothing
here defines a metric again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from kv_cache_tester.metrics import finite, interactivity_tok_s
from kv_cache_tester.replay import Window
from pydantic import BaseModel

from agentsweep.collect.aggregate import Row
from agentsweep.contract.cell import IN_PROCESS_ROUTER, Cell
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
    """What one exported row is made of: collect's typed row of the cell (its figures in the engine's
    clock, its power summary), the parsed cell, its versions, the failed requests per error class,
    summary.json's window (None for a FAILED cell, which holds no summary) and where the run departs
    from its replay preset (``CellResult.failed_by_class``, ``.window``, ``.preset_deviations``)."""

    row: Row
    cell: Cell
    versions: Mapping[str, str | None]
    failed_by_class: Mapping[str, int] = field(default_factory=dict)
    window: Window | None = None
    deviations: tuple[str, ...] = ()

    @property
    def exp_name(self) -> str:
        return self.row.exp_name

    @property
    def outcome(self) -> Outcome:
        return cast(Outcome, self.row.status)

    @property
    def reason(self) -> str:
        """Why the cell is not SUCCESS (collect's reason)."""
        return self.row.reason


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def _col(stat: str) -> str:
    return stat.replace(".", "")


def _latency(row: Row, metric: str) -> Statistics:
    """A latency's statistics from collect's ``{metric}_{stat}_s`` columns."""
    return Statistics.model_validate({s: row.number(f"{metric}_{_col(s)}_s") for s in LATENCY_STATS})


def _interactivity(row: Row) -> Statistics:
    """1 / full-response ITL at each statistic (collect's interactivity columns)."""
    return Statistics.model_validate(
        {s: row.number(f"interactivity_{_col(s)}_tok_per_s") for s in LATENCY_STATS}
    )


def _e2e_norm_interactivity(row: Row) -> Statistics:
    """1 / E2E per output token at each statistic (collect's E2E-normalised interactivity columns)."""
    return Statistics.model_validate(
        {s: row.number(f"e2e_norm_interactivity_{_col(s)}_tok_per_s") for s in LATENCY_STATS}
    )


def _token_gap_interactivity(row: Row) -> Statistics:
    """1 / token-gap ITL at each statistic; no std (the token gaps are not per-request speeds)."""
    figures = {s: interactivity_tok_s(row.number(f"itl_{_col(s)}_s")) for s in LATENCY_STATS}
    figures["std"] = None
    return Statistics.model_validate(figures)


def _scale(row: Row) -> float:
    return row.number("clock_scale") or 1.0


def _duration(row: Row) -> float | None:
    window = row.number("window_s")
    return None if window is None else window * _scale(row)


def _tokens(row: Row, rate_column: str) -> int | None:
    """A server counter's growth over the window: its rate times the window (both in one clock)."""
    rate, duration = row.number(rate_column), _duration(row)
    return None if rate is None or duration is None else round(rate * duration)


def _stability(row: Row, flat: str) -> float | int | None:
    if flat == "observed_window_seconds":
        subwindow = row.number("stability_subwindow_s")
        return None if subwindow is None else subwindow * _scale(row)
    nested = dict(STABILITY_KEYS)[flat]
    value = row.number(f"stability_{nested}")
    return _int(value) if flat in STABILITY_COUNTS else value


def _window_range(row: Row, metric: str, stat: str, end: str) -> float | None:
    return row.number(f"stability_{stat}_{metric}_{end}")


def _outcome(point: Point) -> dict[str, Any]:
    reasons = [r.strip() for r in point.reason.split(";") if r.strip()] if point.outcome != "SUCCESS" else []
    return {
        "status": "passed" if point.outcome == "SUCCESS" else "failed",
        "verdict": point.outcome,
        "reasons": reasons,
        "failed_requests": _int(point.row.number("requests_failed")),
    }


def _power(point: Point) -> dict[str, Any]:
    """The power keys under InferenceX's power contract (schema 2), from collect's power columns and
    the power summary they render (never computed again here); empty when the cell's runner samples
    no power."""
    v, cell, power = point.row, point.cell, point.row.power
    if cell.node.power_source == "none" or power is None:
        return {}
    valid, audit = power.power_valid, power.audit
    codes = [c for c in power.reason_codes if c in REASON_CODES]
    gpus = cell.gpus
    p90_total = v.number("p90_power_w")
    figures = {
        "avg_power_w": v.number("avg_power_per_gpu_w"),
        "avg_total_gpu_power_w": v.number("avg_power_w"),
        "p90_power_w": None if p90_total is None else p90_total / gpus,
        "p90_total_gpu_power_w": p90_total,
        **{name: v.number(name) for name in SAME_NAMED_POWER},
    }
    return {
        "power_metric_schema_version": POWER_METRIC_SCHEMA_VERSION,
        "power_valid": 1 if valid else 0,
        **{name: (figures[name] if valid else None) for name in POWER_FIGURES},
        "power_invalid_reasons": list(dict.fromkeys(codes)),
        "power_audit": {
            "source": POWER_SOURCE,
            "window_start_unix": finite(audit.window_start_unix),
            "window_end_unix": finite(audit.window_end_unix),
            "expected_gpu_count": audit.expected_gpus,
            "observed_gpu_count": audit.observed_gpus,
            "sample_count": audit.samples,
            "max_sample_gap_s": finite(audit.largest_gap_s),
            "reasons": list(power.reasons),
        },
    }


def identity(point: Point) -> dict[str, Any]:
    """The fields both shapes share."""
    cell, values = point.cell, point.row
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
        "recipe_fingerprint": values.text("recipe_fingerprint") or None,
        "num_requests_total": _int(values.number("req_records")),
        "num_requests_successful": _int(values.number("requests_ok")),
        "duration_seconds": _duration(values),
        "replay_preset": {"name": cell.replay.preset, "deviations": list(point.deviations)},
        "kv_cache_pool_tokens": _int(values.number("kv_pool_tokens")),
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
    v = point.row
    gpu_hit, cpu_hit = v.number("gpu_hit_rate"), v.number("cpu_hit_rate")
    router_name = None
    if point.cell.routed:  # a virtual-clock cell's replicas are routed in its own process
        router_name = IN_PROCESS_ROUTER if point.cell.clock == "virtual" else point.cell.router_program
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
                    input=RateModel(tokens_per_second=v.number("input_tok_per_s")),
                    output=RateModel(tokens_per_second=v.number("output_tok_per_s")),
                    total=RateModel(tokens_per_second=v.number("total_tok_per_s")),
                    duration_seconds=_duration(v),
                    per_gpu=PerGpu(
                        total_tput_tps=v.number("total_tok_per_s_per_gpu"),
                        output_tput_tps=v.number("output_tok_per_s_per_gpu"),
                        input_tput_tps=v.number("input_tok_per_s_per_gpu"),
                    ),
                ),
                cache=RequestCache(theoretical_cache_hit_rate=v.number("theoretical_hit_rate")),
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
                    gpu_usage_pct=v.number("kv_usage_peak"),
                    gpu_total_tokens=_int(v.number("kv_pool_tokens")),
                ),
                tokens=Tokens(
                    prompt_total=_tokens(v, "server_prompt_tok_per_s"),
                    generation_total=_tokens(v, "server_generation_tok_per_s"),
                    requests_completed=_int(v.number("requests_ok")),
                ),
            ),
            "request_accounting": RequestAccounting(
                records_total=_int(v.number("req_records")),
                records_profiled=_int(v.number("requests_sent")),
                records_warmup_dropped=_int(v.number("requests_warmup")),
                records_error_dropped=_int(v.number("requests_failed")),
                error_categories=dict(point.failed_by_class),
            ),
            "router": Router(name=router_name, version=point.versions.get("router") if router_name else None),
        }
    )


def flat_row(point: Point) -> BaseModel:
    """The flat row of one point, from collect's columns directly."""
    v = point.row
    out: dict[str, Any] = identity(point)
    sources = {
        "ttft": lambda s: v.number(f"ttft_{s}_s"),
        "e2el": lambda s: v.number(f"e2e_{s}_s"),
        "itl": lambda s: v.number(f"full_response_itl_{s}_s"),
        "tpot": lambda s: v.number(f"tpot_{s}_s"),
        "intvty": lambda s: v.number(f"interactivity_{s}_tok_per_s"),
    }
    sources["full_response_itl"] = sources["itl"]
    sources["full_response_intvty"] = sources["intvty"]
    sources["e2e_norm_intvty"] = lambda s: v.number(f"e2e_norm_interactivity_{s}_tok_per_s")
    for metric, _ in FLAT_METRICS:
        for prefix, key in STATS:
            out[f"{prefix}_{metric}"] = sources[metric](_col(key))
    out.update(
        input_tput_tps=v.number("input_tok_per_s"),
        output_tput_tps=v.number("output_tok_per_s"),
        total_tput_tps=v.number("total_tok_per_s"),
        tput_per_gpu=v.number("total_tok_per_s_per_gpu"),
        output_tput_per_gpu=v.number("output_tok_per_s_per_gpu"),
        input_tput_per_gpu=v.number("input_tok_per_s_per_gpu"),
        theoretical_cache_hit_rate=v.number("theoretical_hit_rate"),
        server_gpu_cache_hit_rate=v.number("gpu_hit_rate"),
        server_cpu_cache_hit_rate=v.number("cpu_hit_rate"),
        gpu_kv_cache_usage_pct=v.number("kv_usage_peak"),
        total_prompt_tokens=_tokens(v, "server_prompt_tok_per_s"),
        total_generation_tokens=_tokens(v, "server_generation_tok_per_s"),
        total_requests_completed=_int(v.number("requests_ok")),
    )
    for flat, _ in STABILITY_KEYS:
        out[flat] = _stability(v, flat)
    for metric, stat, end in WINDOW_RANGES:
        out[f"observed_window_{stat}_{metric}_{end}"] = _window_range(v, metric, stat, end)
    return FlatRow.model_validate(out)
