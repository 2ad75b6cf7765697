"""The replayer's output files, typed: one ``RequestRecord`` per line of requests.jsonl and the
``Summary`` in summary.json (ARCHITECTURE §4 and §5), plus readers that check an artifact against
these types.

Everything that writes or reads these files goes through this module: the replayer, the AIPerf
exports, collect and the flamegraphs. ``SCHEMA_VERSION`` (written into summary.json) covers both
files; bump it whenever a key changes meaning or goes away, and update every reader with it.

The readers are lenient about keys that are absent (an older or third-party writer may leave some
out; a reader then sees None) and strict about everything present: a value of the wrong type is an
error naming the file and the field, never a silent blank.
"""

import functools
import math
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any, Literal, NotRequired, TypedDict, cast

from kv_cache_tester.errors import KVTesterError
from kv_cache_tester.stats import Distribution, percentile

SCHEMA_VERSION = 1
REQUESTS_FILE = "requests.jsonl"
SUMMARY_FILE = "summary.json"

Phase = Literal["warmup", "profile"]
Status = Literal["ok", "error"]
PromptTokensSource = Literal["server", "synthesized"]


class ResultError(KVTesterError):
    """A result file breaks its contract. Message: ``<file>: <field>: <what>``."""

    exit_code = 2
    prefix = "result error"


# --- requests.jsonl ---------------------------------------------------------------------------


class ItlSummary(TypedDict):
    """A request's inter-token latencies, summarized (the raw list is not kept)."""

    mean: float | None
    p50: float | None
    p99: float | None
    max: float | None
    n: int


def itl_summary(itls: Sequence[float]) -> ItlSummary:
    """The per-request ITL summary kept in requests.jsonl instead of the raw list."""
    if not itls:
        return {"mean": None, "p50": None, "p99": None, "max": None, "n": 0}
    data = sorted(itls)
    return {
        "mean": math.fsum(data) / len(data),
        "p50": percentile(data, 50.0),
        "p99": percentile(data, 99.0),
        "max": data[-1],
        "n": len(data),
    }


# "class" is a keyword, hence the functional form.
RequestError = TypedDict(
    "RequestError", {"class": str, "message": str | None, "usage": NotRequired[dict[str, Any]]}
)  # usage: for a bad_usage error, the figures as the server reported them


class RequestRecord(TypedDict):
    """One finished request. Times are seconds; ``t_*`` count from the run start (monotonic)."""

    trace_id: str
    session_id: str  # the trace id, or "<trace>:<agent>" for a sub-agent
    user: int | None  # the lane; None for clients without lanes (AIPerf)
    turn: int  # the request's index in its trace or sub-agent
    phase: Phase
    play: NotRequired[int]  # how many times this lane set had played the trace before
    salt: NotRequired[str]  # content salt of a replayed trace ("" on its first play)
    request_id: str | None
    t_dispatch: float
    t_done: float
    dispatch_lag_s: NotRequired[float]  # how late the request left against its schedule
    ttft_s: float | None
    e2e_s: float | None
    itl_s: ItlSummary
    tpot_s: float | None
    prompt_tokens: int | None  # the server's usage when given, else the synthesized count
    prompt_tokens_source: PromptTokensSource
    cached_tokens: int | None  # the server's usage (prompt_tokens_details.cached_tokens) when given
    expected_prompt_tokens: int | None
    output_tokens: int | None
    expected_output_tokens: int | None
    theoretical_hit_blocks: int | None  # leading blocks that accepted requests of the scope held
    total_blocks: int | None
    # Whether the server took the request (its first token, or a usage with its prompt count): only
    # accepted requests count in the theoretical hit rate. Absent (older writers): ok requests count.
    accepted: NotRequired[bool]
    retries: NotRequired[int]  # sends again after a stale keep-alive connection (0 or 1)
    status: Status
    error: RequestError | None
    client: NotRequired[str]  # set by other clients ("aiperf"); absent for the replayer


# --- summary.json -----------------------------------------------------------------------------


class Counts(TypedDict):
    sent: int  # profile-phase requests
    ok: int
    failed: int
    failed_by_class: dict[str, int]
    warmup: int


class Window(TypedDict):
    start_unix: float
    end_unix: float
    duration_s: float


class Throughput(TypedDict):
    requests_per_s: float | None
    input_tok_per_s: float | None
    output_tok_per_s: float | None
    total_tok_per_s: float | None


class Latency(TypedDict):
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    interactivity_tok_per_s: Distribution


class Slo(TypedDict):
    ttft_s: float | None
    tpot_s: float | None
    goodput_requests_per_s: float | None
    attainment: float | None


class Cache(TypedDict):
    theoretical_hit_rate: float | None  # hit blocks / total blocks, profile requests the server accepted
    client_hit_rate: float | None  # cached / prompt tokens, ok requests with server usage
    prompt_tokens: int  # the denominator of client_hit_rate
    cached_tokens: int  # its numerator


class DispatchLag(TypedDict):
    p50: float | None
    p99: float | None
    max: float | None


class SelfAudit(TypedDict):
    dispatch_lag_s: DispatchLag
    first_dispatch_spread_s: float | None
    client_cpu_s: float
    client_cpu_share: float | None
    workers: int
    stop_reason: str
    abandoned_in_flight: int
    idle_lanes: int
    unsent_requests: int  # requests of started plays never dispatched (a run cut short)


class Summary(TypedDict):
    schema_version: int
    counts: Counts
    window: Window
    throughput: Throughput
    latency: Latency
    slo: Slo
    cache: Cache
    self_audit: SelfAudit
    users: int
    options: dict[str, Any]
    client: NotRequired[str]  # set by other clients ("aiperf")
    aiperf: NotRequired[dict[str, Any]]  # AIPerf's own headline figures, for cross-checking
    # Written by the cell after the run (agentsweep's validity checks): valid, reasons, checks.
    validity: NotRequired[dict[str, Any]]


# What a summary must hold to be read at all; every other key may be absent.
SUMMARY_REQUIRED = frozenset(
    {"schema_version", "counts", "window", "window.start_unix", "window.end_unix", "throughput", "latency"}
)
# What every reader of a record needs.
RECORD_REQUIRED = frozenset({"trace_id", "t_dispatch"})


# --- readers ----------------------------------------------------------------------------------


def _what(tp: Any) -> str:
    """How a type reads in an error message."""
    if tp is bool:
        return "true or false"
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is str:
        return "a string"
    if tp is type(None):
        return "null"
    if typing.is_typeddict(tp) or typing.get_origin(tp) is dict:
        return "an object"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_what(a) for a in typing.get_args(tp))
    return str(tp)


def _matches(value: Any, tp: Any) -> bool:
    """Whether ``value`` (decoded JSON) has the scalar or container shape ``tp``."""
    if tp is Any:
        return True
    if tp is bool:
        return isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if tp is type(None):
        return value is None
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if typing.is_typeddict(tp) or origin is dict:
        return isinstance(value, dict)
    raise TypeError(f"no check for {tp!r}")  # pragma: no cover - a type added above without a check


@functools.cache
def _hints(td: Any) -> dict[str, Any]:
    return typing.get_type_hints(td)


def _check(value: Any, tp: Any, path: str, where: str, required: frozenset[str]) -> None:
    if not _matches(value, tp):
        raise ResultError(f"{where}: {path}: must be {_what(tp)}, got {_show(value)}")
    if value is None:
        return
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None) and _matches(value, a))
    if typing.is_typeddict(tp):
        _check_object(value, tp, path, where, required)
    elif typing.get_origin(tp) is dict:
        _, item = typing.get_args(tp)
        for key, sub in value.items():
            _check(sub, item, f"{path}.{key}", where, required)


def _check_object(value: dict[str, Any], td: Any, prefix: str, where: str, required: frozenset[str]) -> None:
    for key, tp in _hints(td).items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in value:
            if path in required:
                raise ResultError(f"{where}: {path}: missing")
            continue
        _check(value[key], tp, path, where, required)


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def read_summary(data: Any, where: str = SUMMARY_FILE) -> Summary:
    """``data`` (decoded summary.json) as a Summary, or ResultError naming ``where`` and the field.

    Checks: schema_version is SCHEMA_VERSION; counts, window, throughput and latency are present;
    the window has a start and an end, in that order; every value present has its declared type.
    """
    if not isinstance(data, dict):
        raise ResultError(f"{where}: must be an object, got {_show(data)}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ResultError(
            f"{where}: schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}"
        )
    _check_object(data, Summary, "", where, SUMMARY_REQUIRED)
    window = data["window"]
    for key in ("start_unix", "end_unix"):
        if not math.isfinite(window[key]):
            raise ResultError(f"{where}: window.{key}: must be a finite number, got {window[key]!r}")
    if window["end_unix"] < window["start_unix"]:
        raise ResultError(
            f"{where}: window: end_unix {window['end_unix']!r} is before start_unix {window['start_unix']!r}"
        )
    return cast(Summary, data)


def read_record(
    data: Any, where: str = REQUESTS_FILE, required: Iterable[str] = RECORD_REQUIRED
) -> RequestRecord:
    """``data`` (one decoded line of requests.jsonl) as a RequestRecord, or ResultError naming
    ``where`` (say, ``requests.jsonl: line 7``) and the field."""
    if not isinstance(data, dict):
        raise ResultError(f"{where}: must be an object, got {_show(data)}")
    _check_object(data, RequestRecord, "", where, frozenset(required))
    return cast(RequestRecord, data)
