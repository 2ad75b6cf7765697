"""The metric columns of summary.csv, declared once with their units (cell fields come first and are
not listed here; see aggregate.CELL_FIELDS).

Each column says where its value comes from: a field of the replayer's summary.json (``source``, a
dotted path into ``kv_cache_tester.replay.Summary``), a figure derived in collect, the server's
metrics over the window (window.py) or the recount of requests.jsonl (stream.py). The unit decides
how a sped-up simulated cell is rescaled to the engine's clock (see ``ENGINE_CLOCK``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Unit(StrEnum):
    SECONDS = "s"  # a latency the engine's speed shortens
    WALL_SECONDS = "wall s"  # a length of wall time (window, client lag, scrape gap): never rescaled
    UNIX_SECONDS = "unix s"
    REQUESTS_PER_S = "req/s"
    TOKENS_PER_S = "tok/s"
    TOKENS_PER_S_PER_GPU = "tok/s/gpu"
    TOKENS_PER_S_PER_USER = "tok/s/user"  # interactivity
    COUNT = "count"
    TOKENS = "tokens"
    BYTES = "bytes"
    FRACTION = "fraction"  # 0..1 (hit rates, usage, shares)
    FACTOR = "factor"
    JSON = "json"  # a nested value, as compact JSON
    FLAG = "flag"  # true or false
    LABEL = "label"  # a short text (a router policy, a disaggregation shape)
    # Power (energy.power_summary): already in the engine's clock, so never rescaled.
    WATTS = "W"
    JOULES = "J"
    JOULES_PER_TOKEN = "J/tok"
    JOULES_PER_REQUEST = "J/req"
    CELSIUS = "°C"
    PERCENT = "%"


# How a value in each unit changes when the engine runs S times faster than the wall clock:
# latencies are multiplied by S, rates divided by S; everything else stays.
ENGINE_CLOCK: dict[Unit, int] = {
    Unit.SECONDS: 1,
    Unit.REQUESTS_PER_S: -1,
    Unit.TOKENS_PER_S: -1,
    Unit.TOKENS_PER_S_PER_GPU: -1,
    Unit.TOKENS_PER_S_PER_USER: -1,
}


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    unit: Unit
    source: str | None = None  # dotted path in summary.json; None: computed in collect


# Every latency's statistics (kv_cache_tester.metrics.STAT_KEYS; p75 and std are empty for a summary
# written before they were).
LATENCY_STATS = ("mean", "p50", "p75", "p90", "p95", "p99", "p99.9", "std")
THROUGHPUTS = ("input_tok_per_s", "output_tok_per_s", "total_tok_per_s")
# Interactivity = 1 / full-response ITL at each statistic (docs/metrics.md); std: of per-request speeds.
INTERACTIVITY_STATS = LATENCY_STATS
# Interactivity from the plain ITL (token gaps), kept beside it.
PLAIN_INTERACTIVITY_STATS = ("p50", "p90", "p99")

# From summary.json, in summary.csv order.
SUMMARY: tuple[Column, ...] = (
    Column("requests_sent", Unit.COUNT, "counts.sent"),
    Column("requests_ok", Unit.COUNT, "counts.ok"),
    Column("requests_failed", Unit.COUNT, "counts.failed"),
    Column("requests_warmup", Unit.COUNT, "counts.warmup"),
    Column("failed_by_class", Unit.JSON, "counts.failed_by_class"),
    Column("window_start_unix", Unit.UNIX_SECONDS, "window.start_unix"),
    Column("window_end_unix", Unit.UNIX_SECONDS, "window.end_unix"),
    Column("window_s", Unit.WALL_SECONDS, "window.duration_s"),
    Column("requests_per_s", Unit.REQUESTS_PER_S, "throughput.requests_per_s"),
    *(Column(key, Unit.TOKENS_PER_S, f"throughput.{key}") for key in THROUGHPUTS),
    Column("window_span_start_unix", Unit.UNIX_SECONDS, "window.span_start_unix"),
    Column("window_span_end_unix", Unit.UNIX_SECONDS, "window.span_end_unix"),
    *(
        Column(f"{metric}_{stat.replace('.', '')}_s", Unit.SECONDS, f"latency.{metric}_s.{stat}")
        for metric in ("ttft", "tpot", "itl", "e2e", "full_response_itl")
        for stat in LATENCY_STATS
    ),
    Column("interactivity_std_tok_per_s", Unit.TOKENS_PER_S_PER_USER, "latency.interactivity_tok_per_s.std"),
    # E2E-normalised interactivity: 1 / E2E per output token at each statistic (kv_cache_tester.metrics).
    *(
        Column(
            f"e2e_norm_interactivity_{stat.replace('.', '')}_tok_per_s",
            Unit.TOKENS_PER_S_PER_USER,
            f"latency.e2e_norm_interactivity_tok_per_s.{stat}",
        )
        for stat in LATENCY_STATS
    ),
    *(
        Column(f"stability_{key}", unit, f"stability.{key}")
        for key, unit in (
            ("subwindow_s", Unit.WALL_SECONDS),
            ("expected_window_count", Unit.COUNT),
            ("observed_window_count", Unit.COUNT),
            ("root_trajectory_count", Unit.COUNT),
            ("root_trajectory_kish_effective_count", Unit.COUNT),
            ("root_trajectory_largest_share", Unit.FRACTION),
        )
    ),
    *(
        Column(
            f"stability_{stat}_{key}_{end}",
            Unit.TOKENS_PER_S_PER_USER if key == "intvty" else Unit.SECONDS,
            f"stability.observed_window_{stat}_{key}_{end}",
        )
        for stat in ("p75", "p90")
        for key in ("ttft", "e2el", "intvty")
        for end in ("min", "max")
    ),
    Column("goodput_requests_per_s", Unit.REQUESTS_PER_S, "slo.goodput_requests_per_s"),
    Column("slo_attainment", Unit.FRACTION, "slo.attainment"),
    Column("theoretical_hit_rate", Unit.FRACTION, "cache.theoretical_hit_rate"),
    Column("client_hit_rate", Unit.FRACTION, "cache.client_hit_rate"),
    Column("dispatch_lag_p99_s", Unit.WALL_SECONDS, "self_audit.dispatch_lag_s.p99"),
    Column("client_cpu_share", Unit.FRACTION, "self_audit.client_cpu_share"),
    Column("idle_advanced_s", Unit.WALL_SECONDS, "self_audit.idle_advanced_s"),
    # Where a run departs from its replay preset (a JSON list, by name; docs/replay-parity.md).
    Column("preset_deviations", Unit.JSON, "preset.deviations"),
    # The accuracy gate (docs/accuracy.md): passed | failed | error | not measured, and the score.
    Column("accuracy_task", Unit.LABEL, "accuracy.task"),
    Column("accuracy_outcome", Unit.LABEL, "accuracy.outcome"),
    Column("accuracy_score", Unit.FRACTION, "accuracy.score"),
    Column("accuracy_ci95_low", Unit.FRACTION, "accuracy.ci95_low"),
    Column("accuracy_ci95_high", Unit.FRACTION, "accuracy.ci95_high"),
    Column("accuracy_threshold", Unit.FRACTION, "accuracy.threshold"),
    Column("accuracy_questions", Unit.COUNT, "accuracy.questions"),
)

# Derived from the summary columns and the cell's GPU count (figures.derived_columns): per GPU over
# every GPU of the cell; interactivity = 1 / full-response ITL at each statistic (std from the summary).
DERIVED: tuple[Column, ...] = (
    *(Column(f"{key}_per_gpu", Unit.TOKENS_PER_S_PER_GPU) for key in THROUGHPUTS),
    *(
        Column(f"interactivity_{stat.replace('.', '')}_tok_per_s", Unit.TOKENS_PER_S_PER_USER)
        for stat in INTERACTIVITY_STATS
        if stat != "std"
    ),
    *(
        Column(f"plain_interactivity_{stat}_tok_per_s", Unit.TOKENS_PER_S_PER_USER)
        for stat in PLAIN_INTERACTIVITY_STATS
    ),
)

# The engine's metrics over the profiling window (window.window_figures).
SERVER: tuple[Column, ...] = (
    Column("gpu_hit_rate", Unit.FRACTION),
    Column("cpu_hit_rate", Unit.FRACTION),
    # Hits in the CPU tier over the tokens looked up there (window.cpu_tier_figures), and whether the
    # engine counted those lookups ("engine") or they are taken as the GPU's misses ("inferred").
    Column("cpu_tier_hit_rate", Unit.FRACTION),
    Column("cpu_tier_hit_source", Unit.LABEL),
    Column("kv_usage_peak", Unit.FRACTION),
    Column("kv_usage_mean", Unit.FRACTION),
    Column("cpu_kv_usage_peak", Unit.FRACTION),
    Column("cpu_kv_usage_mean", Unit.FRACTION),
    Column("requests_running_mean", Unit.COUNT),
    Column("requests_waiting_peak", Unit.COUNT),
    Column("preemptions", Unit.COUNT),
    Column("offload_bytes_gpu_to_cpu", Unit.BYTES),
    Column("offload_bytes_cpu_to_gpu", Unit.BYTES),
    Column("server_prompt_tok_per_s", Unit.TOKENS_PER_S),
    Column("server_generation_tok_per_s", Unit.TOKENS_PER_S),
    Column("server_rows_in_window", Unit.COUNT),
    Column("server_max_gap_s", Unit.WALL_SECONDS),
)

# The recount of requests.jsonl (stream.RequestStats.as_columns).
REQUESTS: tuple[Column, ...] = (
    Column("req_records", Unit.COUNT),
    Column("req_bad_lines", Unit.COUNT),
    Column("req_warmup", Unit.COUNT),
    Column("req_profile_ok", Unit.COUNT),
    Column("req_profile_errors", Unit.COUNT),
    Column("req_prompt_tokens", Unit.TOKENS),
    Column("req_cached_tokens", Unit.TOKENS),
    Column("req_output_tokens", Unit.TOKENS),
    Column("req_theoretical_hit_rate", Unit.FRACTION),
    Column("req_client_hit_rate", Unit.FRACTION),
    *(
        Column(f"req_{metric}_p{q}_s", Unit.SECONDS)
        for metric in ("ttft", "e2e", "tpot")
        for q in (50, 90, 99)
    ),
)

# The KV-capacity cliff (kv_cliff.py): the users' live context against the engine's GPU KV pool.
KV_CLIFF: tuple[Column, ...] = (
    Column("kv_working_set_tokens", Unit.TOKENS),
    Column("kv_pool_tokens", Unit.TOKENS),
    Column("past_kv_cliff", Unit.FLAG),
)

# How a scale-out cell is laid out. All but `disagg` are fields of the cell (cell.json), shown in
# summary.csv with the other cell fields; `disagg` is derived from the cell's prefill/decode shapes
# (routed.shape_label: "p<replicas>x<tp>-d<replicas>x<tp>", empty for a cell that is not disaggregated).
SHAPE: tuple[Column, ...] = (
    Column("replicas", Unit.COUNT),
    Column("router", Unit.LABEL),  # the routing policy; empty: one engine, no router
    Column("router_program", Unit.LABEL),
    Column("disagg", Unit.LABEL),
    Column("nodes", Unit.COUNT),
)
SHAPE_DERIVED = ("disagg",)
# What the cell ran on, derived from its engine and hardware fields (Cell.hardware_label): "simulated
# B300" for the simulated engine standing in for a B300, "B200" on the GPU itself. Right after the cell
# fields, with `hardware` (the key) among them.
HARDWARE_LABEL = Column("hardware_label", Unit.LABEL)

# A routed cell's router.json and per-instance metrics (routed.routed_figures); empty for one engine.
ROUTED: tuple[Column, ...] = (
    Column("router_busiest_share", Unit.FRACTION),
    Column("router_prefix_match", Unit.FRACTION),
    Column("router_affinity_share", Unit.FRACTION),
    Column("replica_gpu_hit_min", Unit.FRACTION),
    Column("replica_gpu_hit_max", Unit.FRACTION),
    Column("prefill_gpu_hit_rate", Unit.FRACTION),
)

# GPU power over the profiling window (collect.power from energy.power_summary). Every figure is empty
# when power_valid is false (power_reasons says why); the cell's status does not depend on them.
POWER: tuple[Column, ...] = (
    Column("power_valid", Unit.FLAG),
    Column("avg_power_w", Unit.WATTS),  # the whole cell (all its GPUs)
    Column("p90_power_w", Unit.WATTS),
    Column("avg_power_per_gpu_w", Unit.WATTS),
    Column("total_gpu_energy_j", Unit.JOULES),
    Column("joules_per_output_token", Unit.JOULES_PER_TOKEN),
    Column("joules_per_total_token", Unit.JOULES_PER_TOKEN),
    Column("joules_per_successful_query", Unit.JOULES_PER_REQUEST),
    Column("avg_temp_c", Unit.CELSIUS),
    Column("peak_temp_c", Unit.CELSIUS),
    Column("avg_util_pct", Unit.PERCENT),
    Column("power_reasons", Unit.JSON),  # a list of one-line reasons
    Column("power_reason_codes", Unit.JSON),  # one code per reason (energy.summary.REASON_CODES)
    Column("power_audit", Unit.JSON),
)

CLOCK_SCALE = Column("clock_scale", Unit.FACTOR)

# A simulated cell whose engine stated each request's timeline reports its latencies in the engine's
# own clock (summary.json ``engine_clock``; figures.engine_clock_columns). The client's wall-clock
# figures (times the speed, like every latency of a sped-up cell) stay beside them, with the gap
# between the two: the client and HTTP path's share. Empty for real engines.
CLIENT_CLOCK_STATS = ("p50", "p90", "p99")
ENGINE_CLOCK_COLUMNS: tuple[Column, ...] = (
    Column("latency_clock", Unit.LABEL),  # "engine" (the engine's timelines); empty: the client's clock
    *(
        Column(f"client_{metric}_{stat}_s", Unit.SECONDS, f"latency.{metric}_s.{stat}")
        for metric in ("ttft", "tpot", "itl", "e2e")
        for stat in CLIENT_CLOCK_STATS
    ),
    Column("client_gap_ttft_p50", Unit.FRACTION, "engine_clock.gap.ttft_p50"),
    Column("client_gap_e2e_p50", Unit.FRACTION, "engine_clock.gap.e2e_p50"),
    Column("client_share_e2e", Unit.FRACTION, "engine_clock.gap.e2e_share"),
)

METRICS: tuple[Column, ...] = (
    *SUMMARY, *DERIVED, *SERVER, *ROUTED, *REQUESTS, *KV_CLIFF, *POWER, CLOCK_SCALE, *ENGINE_CLOCK_COLUMNS,
)  # fmt: skip
UNITS: dict[str, Unit] = {c.name: c.unit for c in METRICS}
