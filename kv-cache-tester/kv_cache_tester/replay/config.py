"""The resolved replay options (picklable, shared by the main process and its workers)."""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from kv_cache_tester.errors import UsageError
from kv_cache_tester.replay.memory import DEFAULT_PROMPT_MEMORY_GIB, MAX_PROMPT_TOKENS
from kv_cache_tester.replay.presets import MIN_DURATION_S, PRESETS, resolve


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    api_endpoint: str  # base URL, e.g. http://127.0.0.1:8000 (no trailing /v1)
    trace_directory: str | None
    hf_dataset: str | None
    output_dir: str
    users: int
    test_duration: float | None
    recycle: bool
    max_delay: float
    time_scale: float
    timing_strategy: str
    api_time_scale: float
    advance_min: float
    advance_max: float
    seed: int
    max_context: int
    ignore_eos: bool
    no_max_tokens: bool
    debug_trace: bool
    no_color: bool
    max_concurrent_requests: int
    warmup_requests_per_user: int
    api: str
    tokenizer: str | None
    slo_ttft: float | None
    slo_tpot: float | None
    request_timeout: float
    workers: int
    model: str | None
    grace_period: float
    progress_interval: float
    plot: bool
    max_ttft: float | None = None
    busy_poll: bool = False
    stall_timeout: float = 300.0  # seconds without data on a started stream before it fails (0 = off)
    max_event_bytes: int = 4 << 20  # bound on one SSE event
    max_prompt_memory: float = DEFAULT_PROMPT_MEMORY_GIB  # GiB of prompts held at once (memory.py)
    stability_subwindow: float = 600.0  # seconds; the stability block's sub-window length
    vocab_size: int | None = None  # the served model's, from the server (--api completions, no --tokenizer)
    # One of several client processes (on several nodes) that make one run together (merge.py):
    # this one runs lanes i and traces j with i % client_count == client_index (likewise j).
    client_index: int = 0
    client_count: int = 1
    start_at: float | None = None  # Unix time of the common start instant (--start-at)
    # When nothing is in flight, pending delays are advanced so the next request leaves within this
    # many trace seconds (x time_scale); 0 = off.
    system_idle_cap: float = 0.0
    # Warm-up requests after a lane's first ask for one output token and skip their delays.
    warmup_one_token: bool = False
    # More than this share of the profiled requests failing ends the run (0 = never).
    failed_request_threshold: float = 0.0

    @property
    def lanes(self) -> list[int]:
        """The lanes this process runs (every lane unless it is one of several clients)."""
        return [i for i in range(self.users) if i % self.client_count == self.client_index]

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.api_endpoint)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return parts.hostname or "127.0.0.1", port

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return self.api_endpoint + path

    @property
    def prompt_mode(self) -> str:
        """completions: token ids (from the tokenizer's vocabulary, else the server's vocabulary
        size); chat: text calibrated to the tokenizer, else one word per token (simulated engine)."""
        if self.api == "completions":
            return "ids"
        return "chat" if self.tokenizer else "words"


def _endpoint(raw: str) -> str:
    value = raw.strip().rstrip("/")
    if value.endswith("/v1"):
        value = value[:-3]
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--api-endpoint {raw!r}: expected a URL like http://127.0.0.1:8000")
    try:
        parts.port  # noqa: B018 - validates the port number
    except ValueError as exc:
        raise UsageError(f"--api-endpoint {raw!r}: {exc}") from None
    return value


def from_args(ns: argparse.Namespace) -> ReplayConfig:
    """Validate the parsed flags; every problem is one UsageError line naming the flag."""

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise UsageError(msg)

    need(
        bool(ns.trace_directory) != bool(ns.hf_dataset), "give exactly one of --trace-directory, --hf-dataset"
    )
    preset = getattr(ns, "preset", None)
    if preset:
        defaults = getattr(ns, "preset_defaults", {})
        given = {name: getattr(ns, name) for name in PRESETS[preset]}
        try:
            for name, value in resolve(preset, given, defaults).items():
                setattr(ns, name, value)
        except ValueError as err:
            raise UsageError(str(err)) from None
        least = MIN_DURATION_S[preset]
        need(
            ns.test_duration is not None and ns.test_duration >= least,
            f"--preset {preset} needs --test-duration of at least {least:g} s",
        )
    users = ns.max_users if ns.max_users is not None else (ns.start_users or 1)
    need(users >= 1, f"--max-users {users}: must be at least 1")
    if ns.start_users is not None:
        need(ns.start_users >= 1, f"--start-users {ns.start_users}: must be at least 1")
    need(ns.test_duration is None or ns.test_duration > 0, "--test-duration: must be > 0 seconds")
    need(ns.max_delay >= 0, "--max-delay: must be >= 0")
    need(ns.time_scale > 0, "--time-scale: must be > 0")
    need(ns.api_time_scale >= 0, "--api-time-scale: must be >= 0")
    need(
        0.0 <= ns.advance_min <= ns.advance_max < 1.0,
        f"--advance-min {ns.advance_min} / --advance-max {ns.advance_max}: need 0 <= min <= max < 1",
    )
    need(
        0 <= ns.max_context <= MAX_PROMPT_TOKENS,
        f"--max-context {ns.max_context}: must be from 0 to {MAX_PROMPT_TOKENS} tokens "
        "(the replayer's prompt limit; 0 = cut at that limit)",
    )
    need(
        math.isfinite(ns.max_prompt_memory) and ns.max_prompt_memory > 0,
        f"--max-prompt-memory {ns.max_prompt_memory}: must be a positive number of GiB",
    )
    need(ns.max_concurrent_requests >= 0, "--max-concurrent-requests: must be >= 0 (0 = unlimited)")
    need(ns.warmup_requests_per_user >= 0, "--warmup-requests-per-user: must be >= 0")
    need(
        math.isfinite(ns.system_idle_cap) and ns.system_idle_cap >= 0,
        "--system-idle-cap: must be >= 0 seconds (0 = off)",
    )
    need(
        0.0 <= ns.failed_request_threshold < 1.0,
        f"--failed-request-threshold {ns.failed_request_threshold}: must be from 0 (off) to below 1",
    )
    need(ns.slo_ttft is None or ns.slo_ttft > 0, "--slo-ttft: must be > 0 seconds")
    need(ns.slo_tpot is None or ns.slo_tpot > 0, "--slo-tpot: must be > 0 seconds")
    need(ns.stability_subwindow > 0, "--stability-subwindow: must be > 0 seconds")
    need(ns.request_timeout > 0, "--request-timeout: must be > 0 seconds")
    need(ns.workers >= 1, "--workers: must be >= 1")
    need(
        1 <= ns.client_count <= users,
        f"--client-count {ns.client_count}: must be between 1 and the users ({users})",
    )
    need(
        0 <= ns.client_index < ns.client_count,
        f"--client-index {ns.client_index}: must be between 0 and --client-count - 1",
    )
    need(
        ns.start_at is None or (math.isfinite(ns.start_at) and ns.start_at > 0),
        "--start-at: must be a Unix time",
    )
    need(ns.grace_period >= 0, "--grace-period: must be >= 0 seconds")
    need(ns.stall_timeout >= 0, "--stall-timeout: must be >= 0 seconds (0 = off)")
    need(ns.max_event_bytes >= 1024, "--max-event-bytes: must be at least 1024")
    need(ns.hash_block_mode, "--no-hash-block-mode: only hash-block content is supported")
    return ReplayConfig(
        api_endpoint=_endpoint(ns.api_endpoint),
        trace_directory=ns.trace_directory,
        hf_dataset=ns.hf_dataset,
        output_dir=ns.output_dir,
        users=users,
        test_duration=ns.test_duration,
        recycle=ns.recycle,
        max_delay=ns.max_delay,
        time_scale=ns.time_scale,
        timing_strategy=ns.timing_strategy,
        api_time_scale=ns.api_time_scale,
        advance_min=ns.advance_min,
        advance_max=ns.advance_max,
        seed=ns.seed,
        max_context=ns.max_context,
        ignore_eos=ns.ignore_eos,
        no_max_tokens=ns.no_max_tokens,
        debug_trace=ns.debug_trace,
        no_color=ns.no_color,
        max_concurrent_requests=ns.max_concurrent_requests,
        warmup_requests_per_user=ns.warmup_requests_per_user,
        api=ns.api,
        tokenizer=ns.tokenizer,
        slo_ttft=ns.slo_ttft,
        slo_tpot=ns.slo_tpot,
        stability_subwindow=ns.stability_subwindow,
        request_timeout=ns.request_timeout,
        workers=min(ns.workers, users),
        model=ns.model,
        grace_period=ns.grace_period,
        progress_interval=ns.progress_interval,
        plot=not ns.no_plot,
        max_ttft=ns.max_ttft,
        busy_poll=ns.busy_poll,
        stall_timeout=ns.stall_timeout,
        max_event_bytes=ns.max_event_bytes,
        max_prompt_memory=ns.max_prompt_memory,
        client_index=ns.client_index,
        client_count=ns.client_count,
        start_at=ns.start_at,
        system_idle_cap=ns.system_idle_cap,
        warmup_one_token=ns.warmup_one_token,
        failed_request_threshold=ns.failed_request_threshold,
    )


def options_dict(ns: argparse.Namespace) -> dict[str, Any]:
    """Every flag value as given (for summary.json ``options``)."""
    return {k: v for k, v in sorted(vars(ns).items()) if not callable(v) and k != "preset_defaults"}


def config_dict(cfg: ReplayConfig) -> dict[str, Any]:
    return asdict(cfg)
