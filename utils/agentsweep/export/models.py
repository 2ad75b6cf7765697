"""The two shapes of an InferenceX agentic row, as pydantic models (their JSON Schemas are generated
from these and shipped in ``schemas/``; docs/export.md).

- ``FlatRow``: the shape InferenceX's dashboard loader accepts directly; every statistic is a key
  ``{stat}_{metric}`` (p50 is ``median``). Agentic rows use the full-response ITL: ``*_itl`` and
  ``*_intvty`` are the full-response ITL and ``1 / ITL``, as InferenceX does for agentic rows.
- ``NestedRow`` (agentx-v1): the same facts grouped (``request_metrics``, ``server_metrics``,
  ``request_accounting``, ``power``), with the plain (token-gap) ITL beside the full-response one.

Power (``power_*`` flat, ``power`` nested) is collect's power columns as they are (docs/energy.md): null
when the cell samples no power; every figure null while ``power_valid`` is false, its reasons saying why.

``flatten`` turns a nested row into its flat row. Latencies are seconds, rates tokens per second;
a simulated cell's figures are in its engine's clock (collect's ``clock_scale``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from agentsweep.energy.summary import PowerAudit

FLAT_SCHEMA = "agentx-flat-v1"
NESTED_SCHEMA = "agentx-v1"
# (flat prefix, nested key) of each statistic, in export order.
STATS: tuple[tuple[str, str], ...] = (
    ("mean", "mean"),
    ("median", "p50"),
    ("p75", "p75"),
    ("p90", "p90"),
    ("p95", "p95"),
    ("p99", "p99"),
    ("p99.9", "p99.9"),
    ("std", "std"),
)
# Flat metric name -> the nested latency it is read from (agentic rows: the full-response figures).
FLAT_METRICS: tuple[tuple[str, str], ...] = (
    ("ttft", "ttft"),
    ("e2el", "e2el"),
    ("itl", "full_response_itl"),
    ("tpot", "tpot"),
    ("intvty", "full_response_intvty"),
)
STABILITY_KEYS: tuple[str, ...] = (
    "observed_window_count",
    "root_trajectory_count",
    "root_trajectory_kish_effective_count",
    "root_trajectory_largest_share",
    *(
        f"observed_window_{stat}_{key}_{end}"
        for stat in ("p75", "p90")
        for key in ("ttft", "e2el", "intvty")
        for end in ("min", "max")
    ),
)
# The power figures both shapes carry under the same names (collect's power columns, docs/energy.md).
POWER_FIGURES: tuple[str, ...] = (
    "avg_power_w",
    "total_gpu_energy_j",
    "joules_per_output_token",
    "joules_per_total_token",
    "joules_per_successful_query",
    "avg_temp_c",
    "peak_temp_c",
    "avg_util_pct",
)
Outcome = Literal["SUCCESS", "INVALID", "FAILED"]
TrueFalse = Literal["true", "false"]
OnOff = Literal["on", "off"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Identity(_Model):
    """What the point is: the cell, its engine and its provenance (shared by both shapes)."""

    exp_name: str
    outcome: Outcome = Field(description="the cell's verdict; only SUCCESS unless --include-invalid")
    hw: str = Field(description="the cell's hardware (h200, b300...; its runner's name when it states none)")
    hw_simulated: bool = Field(description="true when the simulated engine stood in for hw (framework sim)")
    conc: int = Field(description="concurrent users")
    image: str
    model: str
    framework: str
    precision: str
    tp: int
    ep: int
    dp_attention: TrueFalse
    disagg: bool
    is_multinode: bool
    num_gpus: int = Field(description="every GPU of the cell (replicas, prefill and decode)")
    offload_mode: OnOff
    prefix_caching: TrueFalse
    kv_offload_backend: str
    allocated_cpu_dram_gb: float
    scenario_type: Literal["agentic-coding"] = "agentic-coding"
    recipe_fingerprint: str | None
    num_requests_total: int | None
    num_requests_successful: int | None
    duration_seconds: float | None = Field(description="the steady window, in the engine's clock")
    prefill_num_workers: int | None = None
    prefill_tp: int | None = None
    prefill_ep: int | None = None
    num_prefill_gpu: int | None = None
    decode_num_workers: int | None = None
    decode_tp: int | None = None
    decode_ep: int | None = None
    num_decode_gpu: int | None = None


class Statistics(_Model):
    mean: float | None
    p50: float | None
    p75: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    p99_9: float | None = Field(alias="p99.9")
    std: float | None


class Latency(_Model):
    """Seconds; ``*intvty`` tokens/s per user, ``1 / ITL`` at each statistic (std: of the per-request
    speeds)."""

    ttft: Statistics
    e2el: Statistics
    itl: Statistics = Field(description="plain ITL: the gaps between streamed tokens")
    tpot: Statistics
    intvty: Statistics = Field(description="1 / plain ITL")
    full_response_itl: Statistics = Field(description="(E2E - TTFT) / (output tokens - 1) per request")
    full_response_intvty: Statistics = Field(description="1 / full-response ITL")


class Rate(_Model):
    tokens_per_second: float | None


class PerGpu(_Model):
    total_tput_tps: float | None = Field(description="input (cached included) + output tokens/s per GPU")
    output_tput_tps: float | None
    input_tput_tps: float | None


class Throughput(_Model):
    input: Rate
    output: Rate
    total: Rate
    per_gpu: PerGpu


class RequestCache(_Model):
    theoretical_cache_hit_rate: float | None


class Stability(_Model):
    observed_window_count: int | None
    expected_window_count: int | None
    subwindow_seconds: float | None
    root_trajectory_count: int | None
    root_trajectory_kish_effective_count: float | None
    root_trajectory_largest_share: float | None
    windows: dict[str, float | None] = Field(
        description="observed_window_{p75,p90}_{ttft,e2el,intvty}_{min,max}"
    )


class RequestMetrics(_Model):
    latency: Latency
    throughput: Throughput
    cache: RequestCache
    stability: Stability


class ServerCache(_Model):
    gpu_cache_hit_rate: float | None
    cpu_cache_hit_rate: float | None
    overall_cache_hit_rate: float | None


class KvCache(_Model):
    gpu_usage_pct: float | None = Field(description="mean GPU KV-cache usage over the window, percent")
    gpu_total_tokens: int | None


class Tokens(_Model):
    prompt_total: int | None
    generation_total: int | None
    requests_completed: int | None


class ServerMetrics(_Model):
    cache: ServerCache
    kv_cache: KvCache
    tokens: Tokens


class RequestAccounting(_Model):
    records_total: int | None
    records_profiled: int | None
    records_warmup_dropped: int | None
    records_error_dropped: int | None
    error_categories: dict[str, int]


class Router(_Model):
    name: str | None
    version: str | None


class Power(_Model):
    """GPU power over the measurement window, in the engine's clock (collect's power columns). Every
    figure is null while ``valid`` is false; ``reasons`` says why, the audit stays."""

    valid: bool
    avg_power_w: float | None = Field(description="the whole cell (all its GPUs), W")
    total_gpu_energy_j: float | None = Field(description="summed over the cell's GPUs, J")
    joules_per_output_token: float | None
    joules_per_total_token: float | None = Field(description="per input (cached included) + output token")
    joules_per_successful_query: float | None
    avg_temp_c: float | None
    peak_temp_c: float | None
    avg_util_pct: float | None
    reasons: list[str] = Field(description="one line per failed check")
    audit: PowerAudit = Field(description="window, expected and observed GPUs, samples, largest gap")


class NestedRow(Identity):
    """An agentx-v1 row."""

    schema_version: Literal["agentx-v1"] = Field("agentx-v1", alias="schema")
    request_metrics: RequestMetrics
    server_metrics: ServerMetrics
    request_accounting: RequestAccounting
    router: Router
    kv_cache_pool_tokens: int | None
    power: Power | None = Field(..., description="null when the cell's runner samples no power")


def _flat_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {
        "schema_version": (Literal["agentx-flat-v1"], Field(FLAT_SCHEMA, alias="schema"))
    }
    for metric, _ in FLAT_METRICS:
        for prefix, _ in STATS:
            name = f"{prefix}_{metric}"
            fields[name.replace(".", "_")] = (float | None, Field(alias=name))
    for name in (
        "input_tput_tps",
        "output_tput_tps",
        "total_tput_tps",
        "tput_per_gpu",
        "output_tput_per_gpu",
        "input_tput_per_gpu",
        "theoretical_cache_hit_rate",
        "server_gpu_cache_hit_rate",
        "server_cpu_cache_hit_rate",
        "gpu_kv_cache_usage_pct",
    ):
        fields[name] = (float | None, ...)
    for name in ("total_prompt_tokens", "total_generation_tokens", "total_requests_completed"):
        fields[name] = (int | None, ...)
    for name in STABILITY_KEYS:
        kind = int if name.endswith("_count") and "kish" not in name else float
        fields[name] = (kind | None, ...)
    fields["power_valid"] = (bool | None, Field(description="null when the cell's runner samples no power"))
    for name in POWER_FIGURES:
        fields[name] = (float | None, ...)
    fields["power_reasons"] = (list[str] | None, ...)
    fields["power_audit"] = (PowerAudit | None, ...)
    return fields


FlatRow = create_model(
    "FlatRow",
    __base__=Identity,
    __doc__="A flat row: InferenceX's dashboard loader's shape (statistics as {stat}_{metric}).",
    **_flat_fields(),
)


def _stat(stats: Statistics, key: str) -> float | None:
    return stats.p99_9 if key == "p99.9" else getattr(stats, key)


def flatten(row: NestedRow) -> BaseModel:
    """The flat row of a nested one: p50 -> ``median_*``, the full-response ITL and interactivity ->
    ``*_itl``/``*_intvty``, per-GPU -> ``tput_per_gpu`` etc., ``power.valid`` -> ``power_valid``,
    ``power.{reasons,audit}`` -> ``power_{reasons,audit}``."""
    req, server = row.request_metrics, row.server_metrics
    values: dict[str, Any] = row.model_dump(include=set(Identity.model_fields))
    latency = req.latency
    for metric, source in FLAT_METRICS:
        stats: Statistics = getattr(latency, source)
        for prefix, key in STATS:
            values[f"{prefix}_{metric}"] = _stat(stats, key)
    tput = req.throughput
    values.update(
        input_tput_tps=tput.input.tokens_per_second,
        output_tput_tps=tput.output.tokens_per_second,
        total_tput_tps=tput.total.tokens_per_second,
        tput_per_gpu=tput.per_gpu.total_tput_tps,
        output_tput_per_gpu=tput.per_gpu.output_tput_tps,
        input_tput_per_gpu=tput.per_gpu.input_tput_tps,
        theoretical_cache_hit_rate=req.cache.theoretical_cache_hit_rate,
        server_gpu_cache_hit_rate=server.cache.gpu_cache_hit_rate,
        server_cpu_cache_hit_rate=server.cache.cpu_cache_hit_rate,
        gpu_kv_cache_usage_pct=server.kv_cache.gpu_usage_pct,
        total_prompt_tokens=server.tokens.prompt_total,
        total_generation_tokens=server.tokens.generation_total,
        total_requests_completed=server.tokens.requests_completed,
    )
    stability = req.stability
    for key in STABILITY_KEYS:
        values[key] = (
            stability.windows[key] if key.startswith("observed_window_p") else getattr(stability, key)
        )
    power = row.power
    values["power_valid"] = None if power is None else power.valid
    for name in POWER_FIGURES:
        values[name] = None if power is None else getattr(power, name)
    values["power_reasons"] = None if power is None else power.reasons
    values["power_audit"] = None if power is None else power.audit
    return FlatRow.model_validate(values)
