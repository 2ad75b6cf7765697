"""The two shapes of an InferenceX agentic row, as pydantic models (their JSON Schemas are generated
from these and shipped in ``schemas/``; docs/export.md says where each key of InferenceX's ingest is
read, with the commit of their code it was read from).

- ``FlatRow``: every statistic a key ``{stat}_{metric}`` (p50 is ``median``), the shape InferenceX's
  ingest maps directly. Agentic rows use the full-response ITL: ``*_itl`` and ``*_intvty`` are the
  full-response ITL and ``1 / ITL``, and the same figures again under ``*_full_response_itl`` and
  ``*_full_response_intvty`` (the keys their ingest prefers for agentic rows).
- ``NestedRow``: the same facts grouped as InferenceX's nested agentic rows
  (``request_metrics``, ``server_metrics``), which their ingest flattens before mapping. Its
  ``latency.itl``/``latency.intvty`` are the full-response figures too (their flattener reads those
  two blocks only), so both shapes give the same numbers; the token-gap ITL is ``token_gap_itl``.

Identity, power and the outcome are top-level keys in both shapes (InferenceX reads them there).
Power follows InferenceX's power contract, schema version 2: ``power_valid`` 1 or 0, ``avg_power_w``
per GPU and ``avg_total_gpu_power_w`` for the cell, reasons as codes; every figure null while
``power_valid`` is 0. Keys that only some rows carry (the prefill/decode roles of a disaggregated
cell; power when the runner samples it) are left out of the others (``row_json``).

``flatten`` turns a nested row into its flat row. Latencies are seconds, rates tokens per second; a
simulated cell's figures are in its engine's clock.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

FLAT_SCHEMA = "agentx-flat-v2"
NESTED_SCHEMA = "agentx-v2"
POWER_METRIC_SCHEMA_VERSION = 2
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
# Flat metric name -> the nested latency block it is read from.
FLAT_METRICS: tuple[tuple[str, str], ...] = (
    ("ttft", "ttft"),
    ("e2el", "e2el"),
    ("itl", "itl"),
    ("tpot", "tpot"),
    ("intvty", "intvty"),
    ("full_response_itl", "full_response_itl"),
    ("full_response_intvty", "full_response_intvty"),
    ("e2e_norm_intvty", "e2e_norm_intvty"),
)
WINDOW_RANGES: tuple[tuple[str, str, str], ...] = tuple(
    (metric, stat, end)
    for metric in ("ttft", "e2el", "intvty")
    for stat in ("p75", "p90")
    for end in ("min", "max")
)
# Flat stability key -> the nested request_metrics.stability key (the ranges aside).
STABILITY_KEYS: tuple[tuple[str, str], ...] = (
    ("observed_window_seconds", "window_seconds"),
    ("observed_window_expected_count", "expected_window_count"),
    ("observed_window_count", "observed_window_count"),
    ("root_trajectory_count", "root_trajectory_count"),
    ("root_trajectory_kish_effective_count", "root_trajectory_kish_effective_count"),
    ("root_trajectory_largest_share", "root_trajectory_largest_share"),
)
STABILITY_COUNTS = frozenset(
    {"observed_window_expected_count", "observed_window_count", "root_trajectory_count"}
)
# Power figures collect's columns carry under the row's names (the cell's whole energy and the joules
# per unit of work are already the cell's, as schema 2 wants).
SAME_NAMED_POWER: tuple[str, ...] = (
    "total_gpu_energy_j",
    "joules_per_output_token",
    "joules_per_total_token",
    "joules_per_successful_query",
    "avg_temp_c",
    "peak_temp_c",
    "avg_util_pct",
)
# The measured power figures (null while power_valid is 0), in export order: per GPU and the cell's
# total, then the same-named ones.
POWER_FIGURES: tuple[str, ...] = (
    "avg_power_w",
    "avg_total_gpu_power_w",
    "p90_power_w",
    "p90_total_gpu_power_w",
    *SAME_NAMED_POWER,
)
POWER_KEYS: tuple[str, ...] = (
    "power_metric_schema_version",
    "power_valid",
    *POWER_FIGURES,
    "power_invalid_reasons",
    "power_audit",
)
ROLE_KEYS: tuple[str, ...] = (
    "prefill_num_workers",
    "prefill_tp",
    "prefill_ep",
    "prefill_dp_attention",
    "num_prefill_gpu",
    "decode_num_workers",
    "decode_tp",
    "decode_ep",
    "decode_dp_attention",
    "num_decode_gpu",
)
# Keys a row leaves out instead of writing null: the roles of a cell that is not disaggregated (a
# present prefill_tp makes InferenceX read the cell as disaggregated) and the power of a runner that
# samples none.
OMITTED_WHEN_NULL = frozenset(ROLE_KEYS) | frozenset(POWER_KEYS)
Outcome = Literal["SUCCESS", "INVALID", "FAILED"]
TrueFalse = Literal["true", "false"]
OnOff = Literal["on", "off"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class BenchmarkOutcome(_Model):
    """How the run ended, as InferenceX reads it: ``status`` "failed" keeps a row out of every curve."""

    status: Literal["passed", "failed"]
    verdict: Outcome = Field(description="the cell's verdict")
    reasons: list[str] = Field(description="why the cell is not SUCCESS (empty when it is)")
    failed_requests: int | None


class PowerAudit(_Model):
    """The measurement window's audit under InferenceX's names (their ingest keeps these fields)."""

    source: str = Field(description="the power samples' file, relative to the raw sibling artifact")
    window_start_unix: float | None
    window_end_unix: float | None
    expected_gpu_count: int
    observed_gpu_count: int
    sample_count: int
    max_sample_gap_s: float | None = Field(description="the largest gap between samples, wall seconds")
    reasons: list[str] = Field(description="the failed checks, one line each (power_invalid_reasons' order)")


class ReplayPreset(_Model):
    """The replay option set the run used and where it departs from it (docs/replay-parity.md)."""

    name: str = Field(description="none: no preset")
    deviations: list[str] = Field(description="each setting the run changed, by name, with both values")


class Identity(_Model):
    """What the point is: the cell, its engine and its provenance (shared by both shapes)."""

    exp_name: str
    outcome: Outcome = Field(description="the cell's verdict; only SUCCESS unless --include-invalid")
    benchmark_outcome: BenchmarkOutcome
    infmax_model_prefix: str | None = Field(description="the model's key on InferenceX; null: unmapped")
    hw: str = Field(description="the cell's hardware; '<gpu>-sim' for a simulated engine")
    simulated: bool = Field(description="true: figures of the simulated engine, not of a GPU")
    conc: int = Field(description="concurrent users")
    users: int
    image: str
    model: str
    framework: str = Field(description="the engine: vllm, sglang, or sim (the simulated engine)")
    precision: str
    spec_decoding: Literal["none"] = "none"
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
    recipe_fingerprint: str | None = Field(description="the recipe (offload and prefix caching included)")
    num_requests_total: int | None
    num_requests_successful: int | None
    duration_seconds: float | None = Field(description="the steady window, in the engine's clock")
    replay_preset: ReplayPreset
    kv_cache_pool_tokens: int | None
    prefill_num_workers: int | None = None
    prefill_tp: int | None = None
    prefill_ep: int | None = None
    prefill_dp_attention: TrueFalse | None = None
    num_prefill_gpu: int | None = None
    decode_num_workers: int | None = None
    decode_tp: int | None = None
    decode_ep: int | None = None
    decode_dp_attention: TrueFalse | None = None
    num_decode_gpu: int | None = None
    power_metric_schema_version: Literal[2] | None = None
    power_valid: Literal[0, 1] | None = None
    avg_power_w: float | None = Field(None, description="mean draw per GPU over the window, W")
    avg_total_gpu_power_w: float | None = Field(None, description="the whole cell (all its GPUs), W")
    p90_power_w: float | None = Field(None, description="p90 over time of the cell's draw, per GPU, W")
    p90_total_gpu_power_w: float | None = None
    total_gpu_energy_j: float | None = None
    joules_per_output_token: float | None = None
    joules_per_total_token: float | None = None
    joules_per_successful_query: float | None = None
    avg_temp_c: float | None = None
    peak_temp_c: float | None = None
    avg_util_pct: float | None = None
    power_invalid_reasons: list[str] | None = Field(None, description="one code per failed check")
    power_audit: PowerAudit | None = None


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
    itl: Statistics = Field(description="the full-response ITL: (E2E - TTFT) / (output tokens - 1)")
    tpot: Statistics
    intvty: Statistics = Field(description="1 / full-response ITL")
    full_response_itl: Statistics
    full_response_intvty: Statistics
    e2e_norm_intvty: Statistics = Field(
        description="E2E-normalised interactivity: 1 / (E2E / output tokens) at each statistic"
    )
    token_gap_itl: Statistics = Field(description="the gaps between streamed tokens")
    token_gap_intvty: Statistics = Field(description="1 / token-gap ITL")


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
    duration_seconds: float | None
    per_gpu: PerGpu


class RequestCache(_Model):
    theoretical_cache_hit_rate: float | None


class Range(_Model):
    min: float | None
    max: float | None


class PercentileRanges(_Model):
    p75: Range
    p90: Range


class ObservedRanges(_Model):
    ttft: PercentileRanges
    e2el: PercentileRanges
    intvty: PercentileRanges


class Stability(_Model):
    window_seconds: float | None
    expected_window_count: int | None
    observed_window_count: int | None
    root_trajectory_count: int | None
    root_trajectory_kish_effective_count: float | None
    root_trajectory_largest_share: float | None
    observed_ranges: ObservedRanges


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
    gpu_usage_pct: float | None = Field(description="peak GPU KV-cache usage over the window, a fraction")
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


class NestedRow(Identity):
    """A nested agentic row."""

    schema_version: Literal["agentx-v2"] = Field("agentx-v2", alias="schema")
    request_metrics: RequestMetrics
    server_metrics: ServerMetrics
    request_accounting: RequestAccounting
    router: Router


def flat_stat_key(prefix: str, metric: str) -> str:
    return f"{prefix}_{metric}"


def _flat_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {
        "schema_version": (Literal["agentx-flat-v2"], Field(FLAT_SCHEMA, alias="schema"))
    }
    for metric, _ in FLAT_METRICS:
        for prefix, _ in STATS:
            name = flat_stat_key(prefix, metric)
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
    ):
        fields[name] = (float | None, ...)
    fields["gpu_kv_cache_usage_pct"] = (
        float | None,
        Field(description="peak GPU KV-cache usage over the window, a fraction (0-1)"),
    )
    for name in ("total_prompt_tokens", "total_generation_tokens", "total_requests_completed"):
        fields[name] = (int | None, ...)
    for name, _ in STABILITY_KEYS:
        fields[name] = ((int if name in STABILITY_COUNTS else float) | None, ...)
    for metric, stat, end in WINDOW_RANGES:
        fields[f"observed_window_{stat}_{metric}_{end}"] = (float | None, ...)
    return fields


FlatRow = create_model(
    "FlatRow",
    __base__=Identity,
    __doc__="A flat agentic row (statistics as {stat}_{metric}).",
    **_flat_fields(),
)


def _stat(stats: Statistics, key: str) -> float | None:
    return stats.p99_9 if key == "p99.9" else getattr(stats, key)


def flatten(row: NestedRow) -> BaseModel:
    """The flat row of a nested one: each latency block's statistics as ``{stat}_{metric}`` (p50 ->
    ``median``), the throughput, cache, token and stability scalars under their flat names."""
    req, server = row.request_metrics, row.server_metrics
    values: dict[str, Any] = row.model_dump(include=set(Identity.model_fields))
    for metric, source in FLAT_METRICS:
        stats: Statistics = getattr(req.latency, source)
        for prefix, key in STATS:
            values[flat_stat_key(prefix, metric)] = _stat(stats, key)
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
    for flat, nested in STABILITY_KEYS:
        values[flat] = getattr(req.stability, nested)
    for metric, stat, end in WINDOW_RANGES:
        ranges: PercentileRanges = getattr(req.stability.observed_ranges, metric)
        values[f"observed_window_{stat}_{metric}_{end}"] = getattr(getattr(ranges, stat), end)
    return FlatRow.model_validate(values)


def row_json(row: BaseModel) -> dict[str, Any]:
    """A row as the JSON object written: aliases (``p99.9_ttft``, ``schema``), and the keys of
    ``OMITTED_WHEN_NULL`` left out where null."""
    out: dict[str, Any] = row.model_dump(mode="json", by_alias=True)
    for key in OMITTED_WHEN_NULL:
        if key in out and out[key] is None:
            del out[key]
    return out
