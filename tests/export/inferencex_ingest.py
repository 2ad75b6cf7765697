"""InferenceX's ingest of an agentic result row, restated in Python from its source, for the
conformance tests (docs/export.md, "Conformance", lists each rule with the file and line read).

Read in SemiAnalysisAI/InferenceX-app at these commits (each file's own stored version):

- packages/db/src/etl/benchmark-artifacts.ts @ 05fdd9701b3416f7e9c5b0d82c6615d314656f46: which files
  are read (direct ``*.json`` children of ``bmk_*``/``results_*`` directories; a file holds one object
  or an array of them; anything else in an array is a non-object row);
- packages/db/src/etl/agentic-v3-flatten.ts @ 0fff2b54ba50c7bfc63ac869e59124364dffa43f: the nested row
  flattened (``flatten``);
- packages/db/src/etl/benchmark-mapper.ts @ 00f37ac0e67af88b888459baef89e396d34f1a4a: the mapping
  (``map_row``), the power contract, the interactivity invariant;
- packages/db/src/etl/full-response-interactivity.ts @ 1aaedcf22759ecf4806aceafe3a8a2b3542ad16a: the
  full-response figures replace the canonical ITL and interactivity of an agentic row;
- packages/db/src/etl/normalizers.ts @ 14da4753b973b7effc9b16dad161abb2e09664ea: model key, GPU key,
  framework, numbers;
- packages/db/src/etl/topology.ts @ 01668b8719f1d9013a456fdbaa8fc914f9329465 and tpu-normalization.ts
  @ 250052d4e22766cebe69231bce0c54747b02a22c: parallelism and GPU counts;
- packages/db/src/etl/benchmark-ingest.ts @ 01668b8719f1d9013a456fdbaa8fc914f9329465: a point's identity;
- packages/constants/src/gpu-keys.ts @ 0c8d27926279eb875d6260c2b6ec5e2fa26ba7de,
  framework-aliases.ts @ 08913cc7d303be60e289d8e2e4068cd711820d62, models.ts @
  1127bd242f32f83727565ae6d6accf9b753038a8 (the database's model keys; later versions add keys, the
  union of the versions read is kept here).

Nothing here imports the exporter: the tests map what it wrote with these rules and compare the
result with figures read from the result directories themselves.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# -- normalizers.ts -----------------------------------------------------------------------------

GPU_KEYS = {"h100", "h200", "b200", "b300", "gb200", "gb300", "mi300x", "mi325x", "mi355x"}
DB_MODEL_KEYS = {
    "dsr1", "gptoss120b", "llama70b", "qwen3.5", "kimik2.5", "kimik2.6", "kimik2.7-code", "kimik3",
    "minimaxm2.5", "minimaxm2.7", "minimaxm3", "glm5", "glm5.1", "glm5.2", "dsv4",
}  # fmt: skip
PREFIX_ALIASES = {"gptoss": "gptoss120b", "dsv4pro": "dsv4", "kimik2.7": "kimik2.7-code"}
PRECISION_SUFFIX = re.compile(r"-(?:fp4|fp8|mxfp4|nvfp4)(?:-.*)?$", re.IGNORECASE)
FRAMEWORK_ALIASES: dict[str, tuple[str, bool | None]] = {
    "atom-disagg": ("mooncake-atom", True),
    "sglang-disagg": ("mori-sglang", True),
    "trtllm": ("trt", None),
    "dynamo-trtllm": ("dynamo-trt", None),
}


def hw_to_gpu_key(hw: str) -> str | None:
    base = hw.lower().split(":")[-1].split("-")[0]
    return base if base in GPU_KEYS else None


def _prefix_to_key(prefix: str) -> str | None:
    lower = prefix.lower()
    if lower in DB_MODEL_KEYS:
        return lower
    if lower in PREFIX_ALIASES:
        return PREFIX_ALIASES[lower]
    stripped = PRECISION_SUFFIX.sub("", lower)
    if stripped in DB_MODEL_KEYS:
        return stripped
    return PREFIX_ALIASES.get(stripped)


def resolve_model_key(row: dict[str, Any]) -> str | None:
    """The prefix first; the full model name only through their own table (none of ours is in it
    without its prefix, so it is left out here: a row must carry its prefix)."""
    prefix = row.get("infmax_model_prefix") or row.get("model_prefix")
    if prefix:
        return _prefix_to_key(str(prefix))
    return None


def parse_optional_bool(v: Any) -> bool | None:
    if v is True or v in ("true", "True"):
        return True
    if v is False or v in ("false", "False"):
        return False
    return None


def parse_bool(v: Any) -> bool:
    return parse_optional_bool(v) or False


def parse_num(v: Any) -> float | None:
    """JavaScript's ``Number(v)`` (``parseFloat`` for a string): a boolean is 1 or 0, an empty array
    0, an object not a number."""
    if v is None:
        return None
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, int | float):
        return None if isinstance(v, float) and math.isnan(v) else float(v)
    if isinstance(v, str):
        match = re.match(r"\s*[+-]?(\d+\.?\d*(e[+-]?\d+)?|\.\d+(e[+-]?\d+)?|Infinity)", v, re.IGNORECASE)
        return float(match.group(0)) if match else None
    if isinstance(v, list):
        if not v:
            return 0.0
        return parse_num(v[0]) if len(v) == 1 and not isinstance(v[0], list | dict) else None
    return None


def parse_int(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, str):
        match = re.match(r"\s*[+-]?\d+", v)
        return int(match.group(0)) if match else None
    n = parse_num(v)
    return None if n is None or math.isinf(n) else round(n)


def normalize_framework(fw: str, disagg_field: Any) -> tuple[str, bool]:
    lower = fw.lower()
    canonical, alias_disagg = FRAMEWORK_ALIASES.get(lower, (lower, None))
    explicit = parse_optional_bool(disagg_field)
    if alias_disagg is not None:
        return canonical, alias_disagg
    if canonical.startswith("mori-"):
        return canonical, True
    return canonical, explicit if explicit is not None else canonical.startswith("dynamo-")


# -- agentic-v3-flatten.ts ----------------------------------------------------------------------

STAT_KEYS = {
    "mean": "mean", "p50": "median", "median": "median", "p75": "p75", "p90": "p90", "p95": "p95",
    "p99": "p99", "p99.9": "p99.9", "std": "std",
}  # fmt: skip
LATENCY_BLOCKS = ("ttft", "e2el", "itl", "tpot", "intvty")
TOKEN_BLOCKS = {
    "input": "input_tokens",
    "output_actual": "output_tokens_actual",
    "output_expected": "output_tokens_expected",
}
SCALAR_PATHS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("request_metrics", "throughput", "input", "tokens_per_second"), "input_tput_tps"),
    (("request_metrics", "throughput", "output", "tokens_per_second"), "output_tput_tps"),
    (("request_metrics", "throughput", "total", "tokens_per_second"), "total_tput_tps"),
    (("request_metrics", "throughput", "duration_seconds"), "duration_seconds"),
    (("request_metrics", "throughput", "per_gpu", "total_tput_tps"), "tput_per_gpu"),
    (("request_metrics", "throughput", "per_gpu", "output_tput_tps"), "output_tput_per_gpu"),
    (("request_metrics", "throughput", "per_gpu", "input_tput_tps"), "input_tput_per_gpu"),
    (("request_metrics", "cache", "theoretical_cache_hit_rate"), "theoretical_cache_hit_rate"),
    (("server_metrics", "cache", "gpu_cache_hit_rate"), "server_gpu_cache_hit_rate"),
    (("server_metrics", "cache", "cpu_cache_hit_rate"), "server_cpu_cache_hit_rate"),
    (("server_metrics", "cache", "external_cache_hit_rate"), "server_external_cache_hit_rate"),
    (("server_metrics", "kv_cache", "gpu_usage_pct"), "gpu_kv_cache_usage_pct"),
    (("server_metrics", "tokens", "prompt_total"), "total_prompt_tokens"),
    (("server_metrics", "tokens", "generation_total"), "total_generation_tokens"),
    (("server_metrics", "tokens", "requests_completed"), "total_requests_completed"),
    (("request_metrics", "stability", "window_seconds"), "observed_window_seconds"),
    (("request_metrics", "stability", "expected_window_count"), "observed_window_expected_count"),
    (("request_metrics", "stability", "observed_window_count"), "observed_window_count"),
    (("request_metrics", "stability", "min_window_requests"), "observed_window_min_requests"),
    (("request_metrics", "stability", "root_trajectory_count"), "root_trajectory_count"),
    (
        ("request_metrics", "stability", "root_trajectory_kish_effective_count"),
        "root_trajectory_kish_effective_count",
    ),
    (("request_metrics", "stability", "root_trajectory_largest_share"), "root_trajectory_largest_share"),
)


def _at_path(obj: Any, path: tuple[str, ...]) -> Any:
    cur = obj
    for seg in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(seg)
    return cur


def _stat_block(block: Any, suffix: str, out: dict[str, float]) -> None:
    if not isinstance(block, dict):
        return
    for stat, canonical in STAT_KEYS.items():
        n = parse_num(block.get(stat))
        if n is not None:
            out[f"{canonical}_{suffix}"] = n


def flatten(row: dict[str, Any]) -> dict[str, Any]:
    """A nested row's metrics under the flat keys (a row without request_metrics as it is)."""
    if not isinstance(row.get("request_metrics"), dict):
        return row
    flat: dict[str, float] = {}
    for metric in LATENCY_BLOCKS:
        _stat_block(_at_path(row, ("request_metrics", "latency", metric)), metric, flat)
    _stat_block(_at_path(row, ("request_metrics", "qps")), "qps", flat)
    for src, suffix in TOKEN_BLOCKS.items():
        _stat_block(_at_path(row, ("request_metrics", "tokens", src)), suffix, flat)
    for path, key in SCALAR_PATHS:
        n = parse_num(_at_path(row, path))
        if n is not None:
            flat[key] = n
    for metric in ("ttft", "e2el", "intvty"):
        for pct in ("p75", "p90"):
            for bound in ("min", "max"):
                path = ("request_metrics", "stability", "observed_ranges", metric, pct, bound)
                n = parse_num(_at_path(row, path))
                if n is not None:
                    flat[f"observed_window_{pct}_{metric}_{bound}"] = n
    return {**row, **flat}


# -- topology.ts --------------------------------------------------------------------------------


def _chips(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    n = int(value) if isinstance(value, str) and re.fullmatch(r"[1-9]\d*", value) else value
    return n if isinstance(n, int) and n > 0 else None


def _role_chips(value: Any) -> int | None:
    return 0 if value in (0, "0") else _chips(value)


@dataclass(frozen=True)
class Topology:
    disagg: bool
    is_multinode: bool
    prefill_tp: int
    prefill_ep: int
    prefill_workers: int
    decode_tp: int
    decode_ep: int
    decode_workers: int
    num_prefill_gpu: int
    num_decode_gpu: int


def topology(src: dict[str, Any], framework: str, disagg_from_fw: bool) -> Topology:
    """The aggregated and role-shaped topologies (their SGLang/TPU-specific branches left out: they
    need framework sglang or a num_gpus-less row, and every row here names num_gpus)."""
    marker = parse_optional_bool(src.get("is_multinode"))
    if "prefill_tp" in src:
        p_tp = parse_int(src.get("prefill_tp")) or 1
        p_ep = parse_int(src.get("prefill_ep")) or 1
        p_workers = parse_int(src.get("prefill_num_workers")) or 0
        d_tp = parse_int(src.get("decode_tp")) or 1
        d_ep = parse_int(src.get("decode_ep")) or 1
        d_workers = parse_int(src.get("decode_num_workers")) or 0
        role_split = disagg_from_fw or (parse_int(src.get("decode_num_workers")) or 0) > 0
        shared = None if role_split else _chips(src.get("num_gpus"))
        n_p = _role_chips(src.get("num_prefill_gpu"))
        n_p = n_p if n_p is not None else (shared if shared is not None else p_tp * p_ep * max(p_workers, 1))
        n_d = _role_chips(src.get("num_decode_gpu"))
        n_d = n_d if n_d is not None else (shared if shared is not None else d_tp * d_ep * max(d_workers, 1))
    else:
        tp = parse_int(src.get("tp")) or 1
        ep = parse_int(src.get("ep")) or 1
        p_tp = d_tp = tp
        p_ep = d_ep = ep
        p_workers = d_workers = 0
        for_all = _chips(src.get("num_gpus"))
        n_p = _role_chips(src.get("num_prefill_gpu"))
        n_p = n_p if n_p is not None else (for_all if for_all is not None else tp * ep)
        n_d = _role_chips(src.get("num_decode_gpu"))
        n_d = n_d if n_d is not None else (for_all if for_all is not None else tp * ep)
    disagg = disagg_from_fw or d_workers > 0
    if not disagg:
        use_prefill = d_tp <= 0 or d_ep <= 0 or (d_workers <= 0 and n_d <= 0 and (p_workers > 0 or n_p > 0))
        if use_prefill:
            d_tp, d_ep, d_workers, n_d = p_tp, p_ep, p_workers, n_p
        else:
            p_tp, p_ep, p_workers, n_p = d_tp, d_ep, d_workers, n_d
    return Topology(disagg, marker is True, p_tp, p_ep, p_workers, d_tp, d_ep, d_workers, n_p, n_d)


# -- benchmark-mapper.ts ------------------------------------------------------------------------

NON_METRIC_KEYS = {
    "hw", "model", "framework", "precision", "infmax_model_prefix", "isl", "osl", "conc", "image",
    "recipe_fingerprint", "recipe-fingerprint", "result_schema_version", "disagg", "is_multinode",
    "spec_decoding", "tp", "ep", "dp_attention", "prefill_tp", "prefill_ep", "prefill_dp_attention",
    "prefill_num_workers", "decode_tp", "decode_ep", "decode_dp_attention", "decode_num_workers",
    "num_gpus", "num_prefill_gpu", "num_decode_gpu", "num_aggregate_gpu", "scenario_type", "users",
    "offload_mode", "num_requests_total", "num_requests_successful", "kv_offloading",
    "kv_offload_backend", "kv_p2p_transfer", "router", "request_metrics", "server_metrics", "dataset",
    "workers", "power_invalid_reasons", "power_audit", "benchmark_outcome",
}  # fmt: skip
MEASURED_POWER_KEYS = {
    "avg_power_w", "avg_total_gpu_power_w", "total_gpu_energy_j", "p75_power_w", "p75_total_gpu_power_w",
    "p90_power_w", "p90_total_gpu_power_w", "joules_per_successful_query", "joules_per_output_token",
    "joules_per_total_token", "prefill_avg_power_w", "decode_avg_power_w", "joules_per_input_token",
    "prefill_joules_per_input_token", "decode_joules_per_output_token", "avg_temp_c", "peak_temp_c",
    "avg_util_pct", "avg_mem_used_mb", "avg_cpu_socket_power_w", "avg_total_cpu_power_w",
    "total_cpu_energy_j", "avg_total_module_power_w", "total_module_energy_j",
}  # fmt: skip
FULL_RESPONSE_STATS = ("mean", "median", "p75", "p90", "p95", "p99", "p99.9")
POWER_REASON = re.compile(r"^[a-z][a-z0-9_]*$")


def _prefer_full_response(metrics: dict[str, float]) -> dict[str, float]:
    out = dict(metrics)
    if not any(isinstance(out.get(f"{s}_full_response_itl"), float) for s in FULL_RESPONSE_STATS):
        return out
    for stat in FULL_RESPONSE_STATS:
        out.pop(f"{stat}_itl", None)
        out.pop(f"{stat}_intvty", None)
        itl = out.get(f"{stat}_full_response_itl")
        if isinstance(itl, float) and math.isfinite(itl) and itl > 0:
            out[f"{stat}_itl"] = itl
            out[f"{stat}_intvty"] = 1 / itl
    out.pop("std_itl", None)
    out.pop("std_intvty", None)
    for key in ("itl", "intvty"):
        value = out.get(f"std_full_response_{key}")
        if isinstance(value, float) and math.isfinite(value):
            out[f"std_{key}"] = value
    return out


def _power_contract(row: dict[str, Any], metrics: dict[str, float]) -> None:
    if "power_valid" in row:
        metrics["power_valid"] = (
            1.0 if row["power_valid"] in (1, "1") and row["power_valid"] is not True else 0.0
        )
    else:
        metrics.pop("power_valid", None)
    version = row.get("power_metric_schema_version")
    number = isinstance(version, int) and not isinstance(version, bool) and version > 0
    decimal = isinstance(version, str) and re.fullmatch(r"[1-9]\d*", version) is not None
    if "power_metric_schema_version" in row and (number or decimal):
        metrics["power_metric_schema_version"] = float(version)  # type: ignore[arg-type]
    else:
        metrics.pop("power_metric_schema_version", None)


def _power_reasons(raw: Any) -> list[str] | None:
    if not isinstance(raw, list):
        return None
    out: list[str] = []
    for entry in raw:
        code = entry.strip() if isinstance(entry, str) else ""
        if 0 < len(code) <= 64 and POWER_REASON.match(code) and code not in out:
            out.append(code)
    return out or None


def _power_audit(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    audit: dict[str, Any] = {}
    for key in ("window_start_unix", "window_end_unix", "max_sample_gap_s"):
        n = parse_num(raw.get(key))
        if n is not None and math.isfinite(n):
            audit[key] = n
    for key in ("expected_gpu_count", "observed_gpu_count", "sample_count"):
        n = parse_int(raw.get(key))
        if n is not None and n >= 0:
            audit[key] = n
    source = raw.get("source")
    if (
        isinstance(source, str)
        and len(source) <= 512
        and re.fullmatch(r"[a-zA-Z0-9_./-]+", source)
        and not source.startswith("/")
        and ".." not in source.split("/")
    ):
        audit["source"] = source
    numeric = bool(audit)
    for key in ("producer_sha", "exporter_image_sha256"):
        value = raw.get(key)
        audit[key] = value.strip() if isinstance(value, str) and 0 < len(value.strip()) <= 128 else None
    if not numeric and audit["producer_sha"] is None and audit["exporter_image_sha256"] is None:
        return None
    return audit


@dataclass
class Mapped:
    """What InferenceX stores for one row: its configuration, the point's identity and its metrics."""

    model: str
    hardware: str
    framework: str
    precision: str
    spec_method: str
    topology: Topology
    benchmark_type: str
    conc: int
    offload_mode: str
    image: str | None
    recipe_fingerprint: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    power_invalid_reasons: list[str] | None = None
    power_audit: dict[str, Any] | None = None

    def key(self) -> tuple[Any, ...]:
        """The point's identity in their store (benchmark-ingest.ts): the configuration, the type, the
        sequence lengths (none for agentic rows), the concurrency, the offload mode and the recipe."""
        config = (self.hardware, self.framework, self.model, self.precision, self.spec_method, self.topology)
        return (
            config,
            self.benchmark_type,
            None,
            None,
            self.conc,
            self.offload_mode,
            self.recipe_fingerprint,
        )


class Skipped(Exception):
    """The ingest leaves the row out; the message says which counter it adds to."""


def map_row(raw: dict[str, Any]) -> Mapped:
    """One row as InferenceX's mapper stores it, or Skipped saying why it does not."""
    row = flatten(raw)
    if isinstance(row.get("benchmark_outcome"), dict) and row["benchmark_outcome"].get("status") == "failed":
        raise Skipped("failedRun: benchmark_outcome failed")
    model = resolve_model_key(row)
    if model is None:
        raise Skipped(f"unmappedModel: {row.get('infmax_model_prefix') or row.get('model')}")
    gpu = hw_to_gpu_key(str(row.get("hw", "")))
    if gpu is None:
        raise Skipped(f"unmappedHw: {row.get('hw')}")
    agentic = str(row.get("scenario_type", "")).startswith("agentic")
    conc = (
        (parse_int(row.get("users")) or parse_int(row.get("conc"))) if agentic else parse_int(row.get("conc"))
    )
    if not conc or not agentic:
        raise Skipped("noIslOsl")
    successful, total = row.get("num_requests_successful"), row.get("num_requests_total")
    if isinstance(successful, int) and successful == 0 and isinstance(total, int):
        raise Skipped("failedRun: no successful request")
    offload = row.get("offload_mode")
    offload_mode = offload if isinstance(offload, str) and offload else "off"
    framework, disagg_fw = normalize_framework(str(row.get("framework", "")), row.get("disagg"))
    precision = str(row.get("precision", "")).lower()
    precision = {"nvfp4": "fp4", "mxfp4": "fp4"}.get(precision, precision)
    spec = row.get("spec_decoding")
    topo = topology(row, framework, disagg_fw)
    metrics: dict[str, float] = {}
    for key, value in row.items():
        if key in NON_METRIC_KEYS:
            continue
        n = parse_num(value)
        if n is not None:
            metrics[key] = n
    _power_contract(row, metrics)
    metrics = _prefer_full_response(metrics)
    for stat in FULL_RESPONSE_STATS:
        itl = metrics.get(f"{stat}_itl")
        if itl is not None and itl > 0:
            metrics[f"{stat}_intvty"] = 1 / itl
        else:
            metrics.pop(f"{stat}_intvty", None)
    if metrics.get("power_valid") == 0.0:
        for key in MEASURED_POWER_KEYS:
            metrics.pop(key, None)
    fingerprint = row.get("recipe_fingerprint")
    image = row.get("image")
    return Mapped(
        model=model,
        hardware=gpu,
        framework=framework,
        precision=precision,
        spec_method=str(spec).lower() if spec else "none",
        topology=topo,
        benchmark_type="agentic_traces",
        conc=conc,
        offload_mode=offload_mode,
        image=str(image).replace("#", "/") if image else None,
        recipe_fingerprint=fingerprint.strip()
        if isinstance(fingerprint, str) and fingerprint.strip()
        else None,
        metrics=metrics,
        power_invalid_reasons=_power_reasons(row.get("power_invalid_reasons")),
        power_audit=_power_audit(row.get("power_audit")),
    )


# -- benchmark-artifacts.ts ---------------------------------------------------------------------


@dataclass
class ArtifactFile:
    path: str
    rows: list[dict[str, Any]]
    non_object_rows: int


def read_artifacts(root: Path) -> list[ArtifactFile]:
    """Every ``*.json`` directly inside a ``bmk_*`` or ``results_*`` directory of ``root``, sorted; a
    file is one row (an object) or an array of rows."""
    files = []
    for directory in sorted(root.iterdir()):
        if not directory.name.startswith(("bmk_", "results_")) or not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if not path.name.endswith(".json"):
                continue
            data = json.loads(path.read_text())
            rows, odd = [], 0
            for value in data if isinstance(data, list) else [data]:
                if isinstance(value, dict):
                    rows.append(value)
                else:
                    odd += 1
            files.append(ArtifactFile(f"{directory.name}/{path.name}", rows, odd))
    return files
