"""Map a vLLM or SGLang /metrics exposition onto the engine-neutral server_metrics.csv columns.

Reading rules (they hold for every name below):
- A counter is found with or without its ``_total`` suffix; ``_created`` samples are ignored.
- Counters and request counts are summed over every label set (engine, rank, model_name...);
  usage fractions are averaged over them (each DP engine or TP rank reports its own fraction).
- A figure the engine does not report is ``None`` (an empty CSV cell), never a zero; ``map_sources``
  says, for every column, the metric it was read from or why it is absent (the scraper writes that
  to server_metrics.sources.json beside the CSV).
- Read but kept out of the columns: ``vllm:request_prefill_kv_computed_tokens`` (tokens computed
  per finished request) has no column of the same meaning; prompt minus cached tokens is its sum.
- The CPU tier of vLLM 0.33.0 is read through its KV connector's counters: tokens looked up in it
  (``vllm:external_prefix_cache_queries``, vllm/v1/metrics/loggers.py:685) and found there
  (``vllm:prompt_tokens_cached_by_source{source=host}``, loggers.py:781; the CPU offload manager's
  source is ``host``, vllm/v1/kv_offload/cpu/manager.py:211). That release defines no block-level
  CPU-tier lookup, hit, miss or eviction counter (``vllm:kv_offload_cpu_block_*_total``,
  ``vllm:kv_offload_block_eviction_total``: its CPU tier's metrics are
  vllm/v1/kv_offload/cpu/common.py:12-17); SGLang 0.5.23 counts host-pool hits
  (``sglang:cached_tokens_total{cache_source=host}``) but no host-pool lookups or evictions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
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
    # Cached tokens whose blocks were taken for new content (evicted from the device cache).
    "evicted_tokens_total",
    # Tokens looked up in the CPU (offload) tier: what cpu_cache_hits_total is a share of, as the
    # engine counts it (the CPU tier's hit rate read from the engine, not inferred from GPU misses).
    "cpu_cache_queries_total",
)
DIALECTS = ("vllm", "sglang")
# Names read for engines older than the pinned releases, which those releases no longer define (every
# other name below is one the pinned release defines: tests/metrics/test_metrics_engine_names.py checks
# them against scripts/engine_parsers/metric_names/).
OLDER_NAMES: dict[str, str] = {
    "vllm:cpu_cache_usage_perc": "vLLM V0",
    "vllm:gpu_cache_usage_perc": "vLLM V1 up to 0.9",
    "vllm:gpu_prefix_cache_queries": "vLLM V1 up to 0.9",
    "vllm:gpu_prefix_cache_hits": "vLLM V1 up to 0.9",
}
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


def _has_label(name: str, value: str) -> Callable[[Labels], bool]:
    """A label filter: the label ``name`` (any case) is ``value``."""
    return lambda labels: _label_ci(labels, name) == value


def _base(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def parse_exposition(text: str | Exposition) -> Exposition:
    """Parse Prometheus text format; raise ValueError on text that is not an exposition. An
    exposition already read (``read_families``) is itself."""
    if isinstance(text, Exposition):
        return text
    return read_families(text_string_to_metric_families(text))


def read_families(families: Iterable[Metric]) -> Exposition:
    """An exposition of metric families: as parsed from a reply's text, or collected from a registry in
    this process (``CollectorRegistry.collect``: the same families, without rendering and parsing the
    text between them)."""
    expo = Exposition()
    for family in families:
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


class _Row:
    """The figures of one scrape, each with where it came from: the metric it was read from, or
    ``absent: <why>`` when the engine does not provide it."""

    def __init__(self, expo: Exposition) -> None:
        self.expo = expo
        self.values: dict[str, float | None] = {}
        self.sources: dict[str, str] = {}

    def put(self, column: str, value: float | None, source: str, why_absent: str) -> None:
        self.values[column] = value
        self.sources[column] = source if value is not None else f"absent: {why_absent}"

    def first(self, column: str, names: tuple[str, ...], why_absent: str, mean: bool = False) -> None:
        """The first of ``names`` the engine exposes (newest name first)."""
        for name in names:
            if self.expo.has(name):
                value = self.expo.mean(name) if mean else self.expo.total(name)
                if value is not None:
                    self.put(column, value, name, why_absent)
                    return
        self.put(column, None, "", why_absent)


def _device_source(labels: Labels) -> bool:
    return _label_ci(labels, "source") in _DEVICE_SOURCES


def _vllm(expo: Exposition) -> _Row:
    row = _Row(expo)
    row.first(
        "kv_cache_usage",
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "no KV-cache usage gauge",
        mean=True,
    )
    row.first(
        "cpu_kv_cache_usage",
        ("vllm:kv_offload_cpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"),
        "no CPU KV-cache tier (KV offload off, or not possible on this build: vLLM on a CPU cannot offload)",
        mean=True,
    )
    row.first("requests_running", ("vllm:num_requests_running",), "no running-requests gauge")
    # The total waiting gauge; newer releases also split it by reason (capacity, deferred), whose
    # sum is the same figure.
    row.first(
        "requests_waiting",
        ("vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason"),
        "no waiting-requests gauge",
    )
    row.first("prompt_tokens_total", ("vllm:prompt_tokens",), "no prompt-token counter")
    row.first("generation_tokens_total", ("vllm:generation_tokens",), "no generation-token counter")
    row.first(
        "prefix_cache_queries_total",
        ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        "no prefix-cache query counter",
    )
    # Hits in GPU memory: the prefix-cache counter, else the device share of the per-source cached
    # tokens (prompt_tokens_cached_by_source, or prompt_tokens_by_source{source=local_cache_hit}).
    if expo.has("vllm:prefix_cache_hits") or expo.has("vllm:gpu_prefix_cache_hits"):
        row.first(
            "prefix_cache_hits_total", ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"), "unreachable"
        )
    elif expo.has("vllm:prompt_tokens_cached_by_source"):
        row.put(
            "prefix_cache_hits_total",
            expo.total("vllm:prompt_tokens_cached_by_source", _device_source),
            "vllm:prompt_tokens_cached_by_source{source=device}",
            "",
        )
    elif expo.has("vllm:prompt_tokens_by_source"):
        row.put(
            "prefix_cache_hits_total",
            expo.total(
                "vllm:prompt_tokens_by_source",
                lambda labels: _label_ci(labels, "source") == "local_cache_hit",
            ),
            "vllm:prompt_tokens_by_source{source=local_cache_hit}",
            "",
        )
    else:
        row.put("prefix_cache_hits_total", None, "", "no prefix-cache hit counter")
    row.first("preemptions_total", ("vllm:num_preemptions",), "no preemption counter")
    if expo.has("vllm:request_success"):
        row.put(
            "requests_finished_total",
            expo.total(
                "vllm:request_success", lambda labels: _label_ci(labels, "finished_reason") != "abort"
            ),
            "vllm:request_success{finished_reason!=abort}",
            "",
        )
    else:
        row.first(
            "requests_finished_total",
            ("vllm:e2e_request_latency_seconds_count",),
            "no finished-request counter",
        )
    # Hits served from outside GPU memory. The per-source counters (newer releases) split them
    # exactly; otherwise the KV-connector counter stands for the offload tier.
    if expo.has("vllm:prompt_tokens_cached_by_source"):
        row.put(
            "cpu_cache_hits_total",
            expo.total("vllm:prompt_tokens_cached_by_source", lambda labels: not _device_source(labels)),
            "vllm:prompt_tokens_cached_by_source{source!=device}",
            "",
        )
    elif expo.has("vllm:prompt_tokens_by_source"):
        row.put(
            "cpu_cache_hits_total",
            expo.total(
                "vllm:prompt_tokens_by_source",
                lambda labels: _label_ci(labels, "source") == "external_kv_transfer",
            ),
            "vllm:prompt_tokens_by_source{source=external_kv_transfer}",
            "",
        )
    else:
        row.first(
            "cpu_cache_hits_total",
            ("vllm:external_prefix_cache_hits",),
            "no hits from outside GPU memory are counted (no KV connector or offload tier)",
        )
    row.first(
        "cpu_cache_queries_total",
        ("vllm:external_prefix_cache_queries",),
        "no lookups in a CPU tier are counted (no KV connector or offload tier)",
    )
    no_offload = "no KV offload transfer counter (KV offload off, or not possible on this build)"
    for column, direction, flat in (
        ("offload_bytes_gpu_to_cpu_total", "gpu_to_cpu", "vllm:kv_offload_store_bytes"),
        ("offload_bytes_cpu_to_gpu_total", "cpu_to_gpu", "vllm:kv_offload_load_bytes"),
    ):
        if expo.has(flat):
            row.first(column, (flat,), no_offload)
        else:
            row.put(
                column,
                expo.total("vllm:kv_offload_total_bytes", _has_label("transfer_type", direction)),
                f"vllm:kv_offload_total_bytes{{transfer_type={direction}}}",
                no_offload,
            )
    # vLLM has no eviction counter: it publishes each evicted block as a BlockRemoved KV-cache event
    # (--kv-events-config), which a cell's scraper counts in its place (agentsweep.metrics.kv_events).
    # The simulated engine counts them under its own name.
    row.first(
        "evicted_tokens_total",
        ("engine_sim:evicted_tokens",),
        "vLLM exports no eviction counter (its KV-cache events carry evictions: --kv-events-config)",
    )
    return row


def _sglang(expo: Exposition) -> _Row:
    row = _Row(expo)
    prompt = expo.total("sglang:prompt_tokens")
    cached = expo.select("sglang:cached_tokens")
    by_source = expo.samples.get("sglang:cached_tokens", [])
    labelled = any("cache_source" in labels for labels, _ in by_source)
    if cached is None:
        # SGLang creates the counter on the first hit (multiprocess registry): no hits yet.
        row.put(
            "prefix_cache_hits_total",
            0.0 if prompt is not None else None,
            "sglang:cached_tokens (not created yet: no hit so far)",
            "no cached-token counter",
        )
        row.put("cpu_cache_hits_total", None, "", "no cached-token counter yet")
    elif labelled:
        # cache_source is device, host or storage; "total" is SGLang's label for a request whose hits
        # came without a per-source split (as read before the label existed: device hits).
        def source(labels: Labels) -> str:
            return _label_ci(labels, "cache_source")

        gpu = float(sum(v for labels, v in by_source if source(labels) in ("device", "total")))
        cpu = float(sum(v for labels, v in by_source if source(labels) not in ("device", "total")))
        row.put("prefix_cache_hits_total", gpu, "sglang:cached_tokens{cache_source=device|total}", "")
        row.put("cpu_cache_hits_total", cpu, "sglang:cached_tokens{cache_source=host|storage}", "")
    else:  # releases before the cache_source label: every hit is a device (radix) hit
        row.put("prefix_cache_hits_total", float(sum(cached)), "sglang:cached_tokens", "")
        row.put("cpu_cache_hits_total", None, "", "this SGLang does not split cached tokens by source")
    host_used = expo.total("sglang:hicache_host_used_tokens")
    host_total = expo.total("sglang:hicache_host_total_tokens")
    row.first("kv_cache_usage", ("sglang:token_usage",), "no token-usage gauge", mean=True)
    row.put(
        "cpu_kv_cache_usage",
        host_used / host_total if host_used is not None and host_total else None,
        "sglang:hicache_host_used_tokens / sglang:hicache_host_total_tokens",
        "no HiCache host pool (hierarchical cache off)",
    )
    row.first("requests_running", ("sglang:num_running_reqs",), "no running-requests gauge")
    row.first("requests_waiting", ("sglang:num_queue_reqs",), "no queued-requests gauge")
    row.put("prompt_tokens_total", prompt, "sglang:prompt_tokens", "no prompt-token counter")
    row.first("generation_tokens_total", ("sglang:generation_tokens",), "no generation-token counter")
    # Every prompt token is looked up in the radix cache.
    row.put("prefix_cache_queries_total", prompt, "sglang:prompt_tokens", "no prompt-token counter")
    row.first("preemptions_total", ("sglang:num_retracted_requests",), "no retraction counter")
    row.first("offload_bytes_gpu_to_cpu_total", ("sglang:hicache_backup_bytes",), "no HiCache backup counter")
    row.first("offload_bytes_cpu_to_gpu_total", ("sglang:load_back_bytes",), "no HiCache load-back counter")
    row.first(
        "requests_finished_total", ("sglang:e2e_request_latency_seconds_count",), "no finished-request count"
    )
    row.first("evicted_tokens_total", ("sglang:evicted_tokens",), "no evicted-token counter")
    row.put(
        "cpu_cache_queries_total",
        None,
        "",
        "SGLang counts no lookups in its host pool (HiCache): the CPU tier's hit rate is inferred",
    )
    return row


_MAPPERS: dict[str, Callable[[Exposition], _Row]] = {"vllm": _vllm, "sglang": _sglang}


def _mapped(expo: Exposition, dialect: str) -> _Row:
    if dialect not in _MAPPERS:
        raise InputError(f"unknown metrics dialect '{dialect}' (known: {', '.join(DIALECTS)})")
    return _MAPPERS[dialect](expo)


def map_exposition(expo: Exposition, dialect: str) -> dict[str, float | None]:
    """The engine-neutral figures (every COLUMNS name but time_s) of one scrape."""
    return _mapped(expo, dialect).values


def map_sources(expo: Exposition, dialect: str) -> dict[str, str]:
    """Where each figure of ``map_exposition`` comes from: the metric (with its label filter) it was
    read from, or ``absent: <why>`` for a figure this engine does not provide."""
    return _mapped(expo, dialect).sources


def map_text(text: str | Exposition, dialect: str | None = None) -> tuple[str, dict[str, float | None]]:
    """Parse, detect the dialect when not given, and map. Unknown dialect -> InputError."""
    found, row = _map_text(text, dialect)
    return found, row.values


def map_text_sources(
    text: str | Exposition, dialect: str | None = None
) -> tuple[str, dict[str, float | None], dict[str, str]]:
    """``map_text`` plus where each figure came from (``map_sources``)."""
    found, row = _map_text(text, dialect)
    return found, row.values, row.sources


def _map_text(text: str | Exposition, dialect: str | None) -> tuple[str, _Row]:
    expo = parse_exposition(text)
    found = dialect or detect_dialect(expo)
    if found is None:
        names = sorted(expo.families)[:5]
        raise InputError(
            "metrics are neither vLLM ('vllm:') nor SGLang ('sglang:'); first names seen: "
            + (", ".join(names) if names else "none")
        )
    return found, _mapped(expo, found)


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
