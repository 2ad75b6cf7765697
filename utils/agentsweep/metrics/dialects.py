"""Map a vLLM or SGLang /metrics exposition onto the engine-neutral server_metrics.csv columns.

Reading rules (they hold for every name below):
- A counter is found with or without its ``_total`` suffix; ``_created`` samples are ignored.
- Counters and request counts are summed over every label set (engine, rank, model_name...);
  usage fractions are averaged over them (each DP engine or TP rank reports its own fraction).
- A figure the engine does not report is ``None`` (an empty CSV cell), never a zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from agentsweep.errors import InputError

COLUMNS: tuple[str, ...] = (
    "time_s",
    "kv_cache_usage",
    "cpu_kv_cache_usage",
    "requests_running",
    "requests_waiting",
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "cpu_cache_hits_total",
    "preemptions_total",
    "offload_bytes_gpu_to_cpu_total",
    "offload_bytes_cpu_to_gpu_total",
    # Requests the engine finished (not aborted): the client's ok count is checked against it.
    "requests_finished_total",
)
DIALECTS = ("vllm", "sglang")
# vLLM's prompt_tokens_cached_by_source labels for tokens found on the accelerator itself; every
# other source (host, cpu, disk, p2p, external...) is a hit served from outside GPU memory.
_DEVICE_SOURCES = frozenset({"device", "gpu", "local", "local_cache_hit"})
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count", "_gsum", "_gcount")

Labels = dict[str, str]


@dataclass
class Exposition:
    """One parsed scrape: samples by base name (``_total`` stripped), plus every family seen."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    families: set[str] = field(default_factory=set)

    def has(self, name: str) -> bool:
        return name in self.families or name in self.samples

    def select(self, name: str, where: Callable[[Labels], bool] | None = None) -> list[float] | None:
        """Values of ``name`` whose labels pass ``where``; None when the engine does not expose it."""
        if not self.has(name):
            return None
        return [v for labels, v in self.samples.get(name, []) if where is None or where(labels)]

    def total(self, name: str, where: Callable[[Labels], bool] | None = None) -> float | None:
        values = self.select(name, where)
        return None if values is None else float(sum(values))

    def mean(self, name: str) -> float | None:
        values = self.select(name)
        return float(sum(values) / len(values)) if values else None

    def first_total(self, *names: str) -> float | None:
        """The sum of the first of ``names`` the engine exposes (newest name first)."""
        for name in names:
            if self.has(name):
                return self.total(name)
        return None

    def first_mean(self, *names: str) -> float | None:
        for name in names:
            value = self.mean(name)
            if value is not None:
                return value
        return None


def _base(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def parse_exposition(text: str) -> Exposition:
    """Parse Prometheus text format; raise ValueError on text that is not an exposition."""
    expo = Exposition()
    for family in text_string_to_metric_families(text):
        expo.families.add(_base(family.name))
        for sample in family.samples:
            name = sample.name
            if name.endswith("_created"):
                continue
            if family.type in ("histogram", "summary", "gaugehistogram") and name.endswith(_HISTOGRAM_PARTS):
                if name.endswith("_count"):  # observations: e.g. finished requests of a latency histogram
                    expo.samples.setdefault(name, []).append((dict(sample.labels), float(sample.value)))
                continue
            value = float(sample.value)
            if value != value:  # NaN: a gauge the engine has not set yet
                continue
            expo.samples.setdefault(_base(name), []).append((dict(sample.labels), value))
    return expo


def detect_dialect(expo: Exposition) -> str | None:
    """'vllm' or 'sglang' from the metric name prefixes; None when neither is present."""
    counts = dict.fromkeys(DIALECTS, 0)
    for name in expo.families | set(expo.samples):
        for dialect in DIALECTS:
            if name.startswith(dialect + ":"):
                counts[dialect] += 1
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else None


def _label_ci(labels: Labels, key: str) -> str:
    return labels.get(key, "").lower()


def _vllm(expo: Exposition) -> dict[str, float | None]:
    row: dict[str, float | None] = {
        "kv_cache_usage": expo.first_mean("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "cpu_kv_cache_usage": expo.first_mean(
            "vllm:kv_offload_cpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"
        ),
        "requests_running": expo.total("vllm:num_requests_running"),
        "requests_waiting": expo.total("vllm:num_requests_waiting"),
        "prompt_tokens_total": expo.total("vllm:prompt_tokens"),
        "generation_tokens_total": expo.total("vllm:generation_tokens"),
        "prefix_cache_queries_total": expo.first_total(
            "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"
        ),
        "prefix_cache_hits_total": expo.first_total("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
        "preemptions_total": expo.total("vllm:num_preemptions"),
        "requests_finished_total": expo.total(
            "vllm:request_success", lambda labels: _label_ci(labels, "finished_reason") != "abort"
        )
        if expo.has("vllm:request_success")
        else expo.total("vllm:e2e_request_latency_seconds_count"),
    }
    # Hits served from outside GPU memory. The per-source counter (newer releases) splits them
    # exactly; otherwise the KV-connector counter stands for the offload tier.
    if expo.has("vllm:prompt_tokens_cached_by_source"):
        row["cpu_cache_hits_total"] = expo.total(
            "vllm:prompt_tokens_cached_by_source",
            lambda labels: _label_ci(labels, "source") not in _DEVICE_SOURCES,
        )
    else:
        row["cpu_cache_hits_total"] = expo.total("vllm:external_prefix_cache_hits")
    for column, direction, flat in (
        ("offload_bytes_gpu_to_cpu_total", "gpu_to_cpu", "vllm:kv_offload_store_bytes"),
        ("offload_bytes_cpu_to_gpu_total", "cpu_to_gpu", "vllm:kv_offload_load_bytes"),
    ):
        if expo.has(flat):
            row[column] = expo.total(flat)
        else:
            row[column] = expo.total(
                "vllm:kv_offload_total_bytes",
                lambda labels, d=direction: _label_ci(labels, "transfer_type") == d,
            )
    return row


def _sglang(expo: Exposition) -> dict[str, float | None]:
    prompt = expo.total("sglang:prompt_tokens")
    cached = expo.select("sglang:cached_tokens")
    by_source = expo.samples.get("sglang:cached_tokens", [])
    labelled = any("cache_source" in labels for labels, _ in by_source)
    if cached is None:
        # SGLang creates the counter on the first hit (multiprocess registry): no hits yet.
        gpu_hits = 0.0 if prompt is not None else None
        cpu_hits = None
    elif labelled:
        gpu_hits = float(sum(v for labels, v in by_source if _label_ci(labels, "cache_source") == "device"))
        cpu_hits = float(sum(v for labels, v in by_source if _label_ci(labels, "cache_source") != "device"))
    else:  # releases before the cache_source label: every hit is a device (radix) hit
        gpu_hits, cpu_hits = float(sum(cached)), None
    host_used = expo.total("sglang:hicache_host_used_tokens")
    host_total = expo.total("sglang:hicache_host_total_tokens")
    return {
        "kv_cache_usage": expo.mean("sglang:token_usage"),
        "cpu_kv_cache_usage": host_used / host_total if host_used is not None and host_total else None,
        "requests_running": expo.total("sglang:num_running_reqs"),
        "requests_waiting": expo.total("sglang:num_queue_reqs"),
        "prompt_tokens_total": prompt,
        "generation_tokens_total": expo.total("sglang:generation_tokens"),
        "prefix_cache_queries_total": prompt,
        "prefix_cache_hits_total": gpu_hits,
        "cpu_cache_hits_total": cpu_hits,
        "preemptions_total": expo.total("sglang:num_retracted_requests"),
        "offload_bytes_gpu_to_cpu_total": expo.total("sglang:hicache_backup_bytes"),
        "offload_bytes_cpu_to_gpu_total": expo.total("sglang:load_back_bytes"),
        "requests_finished_total": expo.total("sglang:e2e_request_latency_seconds_count"),
    }


_MAPPERS: dict[str, Callable[[Exposition], dict[str, float | None]]] = {"vllm": _vllm, "sglang": _sglang}


def map_exposition(expo: Exposition, dialect: str) -> dict[str, float | None]:
    """The engine-neutral figures (every COLUMNS name but time_s) of one scrape."""
    if dialect not in _MAPPERS:
        raise InputError(f"unknown metrics dialect '{dialect}' (known: {', '.join(DIALECTS)})")
    return _MAPPERS[dialect](expo)


def map_text(text: str, dialect: str | None = None) -> tuple[str, dict[str, float | None]]:
    """Parse, detect the dialect when not given, and map. Unknown dialect -> InputError."""
    expo = parse_exposition(text)
    found = dialect or detect_dialect(expo)
    if found is None:
        names = sorted(expo.families)[:5]
        raise InputError(
            "metrics are neither vLLM ('vllm:') nor SGLang ('sglang:'); first names seen: "
            + (", ".join(names) if names else "none")
        )
    return found, map_exposition(expo, found)


def format_row(time_s: float, values: dict[str, float | None]) -> list[str]:
    """One CSV row in COLUMNS order; a missing figure is an empty cell."""
    out = [f"{time_s:.3f}"]
    for column in COLUMNS[1:]:
        value = values.get(column)
        if value is None:
            out.append("")
        elif float(value).is_integer() and abs(value) < 2**53:
            out.append(str(int(value)))
        else:
            out.append(repr(float(value)))
    return out
