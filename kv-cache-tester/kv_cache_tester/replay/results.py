"""The replayer's output files, typed: one ``RequestRecord`` per line of requests.jsonl and the
``Summary`` in summary.json (ARCHITECTURE §4 and §5), with their only readers and writers.

Everything that writes or reads these files goes through this module: the replayer, the AIPerf
exports, the cell's validity checks, collect and the flamegraphs. ``SCHEMA_VERSION`` (written into
summary.json) covers both files; bump it whenever a key changes meaning or goes away, and update
every reader with it.

- ``RecordReader`` (and ``read_records``, its list) streams requests.jsonl one record at a time: a bad
  line is counted, never fatal, and a line is at most ``RECORD_LINE_MAX_BYTES``.
- ``load_summary`` / ``write_summary`` read and write summary.json (at most ``SUMMARY_MAX_BYTES``).
- ``read_record`` / ``read_summary`` check one decoded value against its type.

The readers are lenient about keys that are absent (an older or third-party writer may leave some
out; a reader then sees None) and strict about everything present: a value of the wrong type is an
error naming the file and the field, never a silent blank.
"""

import functools
import json
import math
import os
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, cast

from kv_cache_tester.errors import KVTesterError
from kv_cache_tester.inputfiles import InputFileProblem, open_regular, read_limited, size_text
from kv_cache_tester.replay.jsonfast import dumps, loads
from kv_cache_tester.stats import Distribution, percentile

SCHEMA_VERSION = 1
REQUESTS_FILE = "requests.jsonl"
SUMMARY_FILE = "summary.json"
# A summary is a few KiB; past this it is not one (a link to an endless file, say).
SUMMARY_MAX_BYTES = 64 << 20
# A record is well under a KiB; a longer line is not one (it is counted bad, never held whole).
RECORD_LINE_MAX_BYTES = 1 << 20

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


class EngineTimes(TypedDict):
    """A request's own timeline as the engine stated it, in the engine's clock (the simulated engine's
    ``sim_timeline``): seconds of simulated time, which runs ``speed`` times faster than the wall
    clock. Real engines state none, so their records lack it."""

    ttft_s: float | None
    e2e_s: float
    tpot_s: float | None
    itl_s: ItlSummary
    output_tokens: int
    speed: float


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
    # The engine's own timeline of this request, when the server stated one (the simulated engine).
    engine: NotRequired[EngineTimes]


def accepted(record: RequestRecord) -> bool:
    """Whether the server took the request (its prefill happened); records without the key (older
    writers) count when they finished ok."""
    value = record.get("accepted")
    return value if value is not None else record.get("status") == "ok"


# The start of the error message of a request the client gave up at the end of the run (its grace
# period over). The server may still finish such a request after the client left.
ABANDONED_AT_END = "abandoned at the end of the run"


def abandoned_at_end(record: RequestRecord) -> bool:
    """Whether the client ended this request itself when the run's grace period ran out."""
    error = record.get("error")
    return error is not None and str(error.get("message", "")).startswith(ABANDONED_AT_END)


# --- summary.json -----------------------------------------------------------------------------


class Counts(TypedDict):
    sent: int  # profile-phase requests
    ok: int
    failed: int
    failed_by_class: dict[str, int]
    warmup: int


class Window(TypedDict):
    """The measurement window: the steady window (replay/steady.py) where ``rule`` is present; files
    written before it hold the whole profiling span and none of the NotRequired keys."""

    start_unix: float
    end_unix: float
    duration_s: float
    rule: NotRequired[str]  # how the window was chosen, in words
    start_s: NotRequired[float]  # its bounds in seconds after the run start (requests.jsonl's clock)
    end_s: NotRequired[float]
    span_start_unix: NotRequired[float]  # the whole profiling span it was chosen from
    span_end_unix: NotRequired[float]
    peak_in_flight: NotRequired[float]
    threshold_in_flight: NotRequired[float]


class Throughput(TypedDict):
    requests_per_s: float | None
    input_tok_per_s: float | None
    output_tok_per_s: float | None
    total_tok_per_s: float | None


class Latency(TypedDict):
    """Seconds, and tokens/s per user; definitions in kv_cache_tester.metrics (docs/metrics.md).

    ``interactivity_tok_per_s`` is ``1 / ITL`` at each statistic of the full-response ITL in files
    that hold ``full_response_itl_s``; older files held the distribution of per-request speeds
    ``1 / TPOT`` under that key (its p90 the fast tail), which is ``output_speed_tok_per_s`` now.
    """

    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    interactivity_tok_per_s: Distribution
    full_response_itl_s: NotRequired[Distribution]
    plain_interactivity_tok_per_s: NotRequired[Distribution]  # 1 / ITL of the token gaps
    output_speed_tok_per_s: NotRequired[Distribution]
    e2e_per_output_token_s: NotRequired[Distribution]  # E2E / output tokens per request
    e2e_norm_interactivity_tok_per_s: NotRequired[Distribution]  # 1 / E2E per output token


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


class ClientAudit(TypedDict):
    """One client process of a run made by several (``merge.merge_clients``): its own self-audit."""

    node: str
    client_cpu_share: float | None  # of its own core (summed over its workers)
    dispatch_lag_p99_s: float | None
    workers: int
    requests: int  # its records (warmup included)


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
    idle_advanced_s: NotRequired[float]  # wall seconds --system-idle-cap advanced the pending delays
    # A run made by several client processes (merge.py), by client index; client_cpu_share is then
    # the busiest client's.
    clients: NotRequired[dict[str, ClientAudit]]


class ClockGap(TypedDict):
    """How much the client's wall clock (times ``speed``) adds to the engine's own figures, over the
    ok profile requests that carry both: the client and HTTP path's share."""

    ttft_p50: float | None  # client TTFT p50 x speed / engine TTFT p50 - 1
    e2e_p50: float | None  # the same for E2E
    e2e_share: float | None  # sum(client E2E x speed - engine E2E) / sum(client E2E x speed)


class Accuracy(TypedDict, total=False):
    """The cell's accuracy gate over its engine (written by the cell, not the replayer): the outcome
    (passed | failed | error | not measured), the task, and for a scored one its figures."""

    outcome: str
    task: str
    reason: str
    threshold: float
    threshold_source: str
    harness: str
    metric: str
    num_fewshot: int | None
    limit: int | None
    seed: int | None
    questions: int | None
    correct: int | None
    score: float | None
    ci95_low: float | None
    ci95_high: float | None
    seconds: float | None


class EngineClock(TypedDict):
    """The figures in the engine's own clock (docs/replayer.md, "Engine clock"), present when the
    server stated each request's timeline; ``latency`` and ``throughput`` mirror the summary's."""

    speed: float  # engine seconds per wall second
    records: int  # ok profile requests with a timeline
    of: int  # ok profile requests
    latency: Latency
    throughput: Throughput
    gap: ClockGap


class Stability(TypedDict):
    """InferenceX's stability keys over the steady window (replay/stability.py); seconds and tok/s
    per user in the client's clock."""

    subwindow_s: float
    expected_window_count: int
    observed_window_count: int
    observed_window_p75_ttft_min: float | None
    observed_window_p75_ttft_max: float | None
    observed_window_p75_e2el_min: float | None
    observed_window_p75_e2el_max: float | None
    observed_window_p75_intvty_min: float | None
    observed_window_p75_intvty_max: float | None
    observed_window_p90_ttft_min: float | None
    observed_window_p90_ttft_max: float | None
    observed_window_p90_e2el_min: float | None
    observed_window_p90_e2el_max: float | None
    observed_window_p90_intvty_min: float | None
    observed_window_p90_intvty_max: float | None
    root_trajectory_count: int
    root_trajectory_kish_effective_count: float | None
    root_trajectory_largest_share: float | None


class PresetUsed(TypedDict):
    """The replay option set a run used (``--preset``) and where the run departs from it."""

    name: str
    deviations: list[str]  # "name value (preset|InferenceX value)" each


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
    engine_clock: NotRequired[EngineClock]  # the engine's own clock, when the server stated it
    # Written by the cell after the run (agentsweep's validity checks): valid, reasons, checks.
    validity: NotRequired[dict[str, Any]]
    # Written by the cell too: its engine's accuracy gate (task, outcome, score, interval, threshold).
    accuracy: NotRequired[Accuracy]
    # InferenceX's stability keys over the steady window (replay/stability.py), seconds and tok/s.
    stability: NotRequired[Stability]
    preset: NotRequired[PresetUsed]  # a run with --preset


# What a summary must hold to be read at all; every other key may be absent.
SUMMARY_REQUIRED = frozenset(
    {"schema_version", "counts", "window", "window.start_unix", "window.end_unix", "throughput", "latency"}
)
# What every reader of a record needs.
RECORD_REQUIRED = frozenset({"trace_id", "t_dispatch"})


# --- checking a decoded value against its type -------------------------------------------------


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


# A fast yes/no per field for the millions of records a long run leaves: the exact Python types a
# decoded value may have, plus a test for what a type alone does not settle (a Literal, a nested
# object). ``_check`` (slow, with the message) runs only on what this refuses, so both always agree
# on what is accepted. None stands for a field that takes anything.
_Shape = tuple[frozenset[type], Callable[[Any], bool] | None] | None
_NONE = type(None)


def _shape(tp: Any) -> _Shape:
    if tp is Any:
        return None
    if tp is float:
        return frozenset({float, int}), None
    if tp in (bool, int, str, _NONE):
        return frozenset({tp}), None
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = frozenset(typing.get_args(tp))
        kinds = frozenset(type(a) for a in allowed)
        return frozenset(), lambda v: type(v) in kinds and v in allowed
    if origin in (typing.Union, types.UnionType):
        parts = [_shape(a) for a in typing.get_args(tp)]
        if any(part is None for part in parts):
            return None
        kinds = frozenset().union(*(part[0] for part in parts if part is not None))
        extras = [part[1] for part in parts if part is not None and part[1] is not None]
        if len(extras) > 1:
            return kinds, lambda v: any(extra(v) for extra in extras)
        return kinds, extras[0] if extras else None
    if typing.is_typeddict(tp):
        fields = _field_shapes(tp)
        return frozenset(), lambda v: type(v) is dict and _fits(v, fields)
    if origin is dict:
        item = _shape(typing.get_args(tp)[1])
        return frozenset(), lambda v: type(v) is dict and all(_fits_one(x, item) for x in v.values())
    raise TypeError(f"no check for {tp!r}")  # pragma: no cover - a type added above without a check


@functools.cache
def _field_shapes(td: Any) -> dict[str, _Shape]:
    return {key: _shape(tp) for key, tp in _hints(td).items()}


def _fits_one(value: Any, shape: _Shape) -> bool:
    return shape is None or type(value) in shape[0] or (shape[1] is not None and shape[1](value))


def _fits(data: dict[str, Any], shapes: dict[str, _Shape]) -> bool:
    """Whether every declared key of ``data`` holds a value of its type (undeclared keys pass)."""
    for key, value in data.items():
        shape = shapes.get(key)
        if shape is not None and type(value) not in shape[0]:
            extra = shape[1]
            if extra is None or not extra(value):
                return False
    return True


def read_summary(data: Any, where: str = SUMMARY_FILE, required: Iterable[str] = SUMMARY_REQUIRED) -> Summary:
    """``data`` (decoded summary.json) as a Summary, or ResultError naming ``where`` and the field.

    Checks: schema_version is SCHEMA_VERSION; the ``required`` keys (dotted paths) are present; a
    window present has a start and an end, finite and in that order; every value present has its
    declared type.
    """
    if not isinstance(data, dict):
        raise ResultError(f"{where}: must be an object, got {_show(data)}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ResultError(
            f"{where}: schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}"
        )
    _check_object(data, Summary, "", where, frozenset(required))
    window = data.get("window", {})
    for key in ("start_unix", "end_unix"):
        if key in window and not math.isfinite(window[key]):
            raise ResultError(f"{where}: window.{key}: must be a finite number, got {window[key]!r}")
    if "start_unix" in window and "end_unix" in window and window["end_unix"] < window["start_unix"]:
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
    need = frozenset(required)
    if not _record_ok(data, need):
        _check_object(data, RequestRecord, "", where, need)
    return cast(RequestRecord, data)


def _record_ok(data: dict[str, Any], required: frozenset[str]) -> bool:
    return required <= data.keys() and _fits(data, _field_shapes(RequestRecord))


# --- summary.json ----------------------------------------------------------------------------


def load_summary(
    out_dir: Path, *, required: Iterable[str] = SUMMARY_REQUIRED, where: str = SUMMARY_FILE
) -> Summary:
    """``out_dir``/summary.json as a checked Summary (see ``read_summary``).

    ResultError, naming ``where``, when it is missing, not a regular file of at most
    SUMMARY_MAX_BYTES (a FIFO would block, a link to /dev/zero never ends), or not a JSON Summary.
    """
    path = out_dir / SUMMARY_FILE
    if not path.exists() and not path.is_symlink():
        raise ResultError(f"{where} missing")
    try:
        raw = read_limited(path, SUMMARY_MAX_BYTES, follow_links=False)
    except InputFileProblem as err:
        raise ResultError(f"{where}: {err}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ResultError(f"{where}: unreadable ({err})") from None
    except (ValueError, RecursionError) as err:
        raise ResultError(f"{where}: not JSON ({err})") from None
    return read_summary(data, where, required)


def write_summary(out_dir: Path, summary: Summary) -> Path:
    """Write ``out_dir``/summary.json atomically (temp file + rename): a reader never sees half a
    summary."""
    path = out_dir / SUMMARY_FILE
    tmp = out_dir / (SUMMARY_FILE + ".tmp")
    try:
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as err:  # a full disk: no temporary file stays behind; the error names the file
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err
    return path


# --- requests.jsonl --------------------------------------------------------------------------


class RecordReader:
    """The records of one requests.jsonl, one at a time in file order; the file is never held whole.

    A bad line is counted (``bad_lines``; the first one described in ``first_bad``), never fatal: one
    that is not a JSON object, is longer than RECORD_LINE_MAX_BYTES, or lacks a ``required`` key or
    holds one of the wrong type. Any other value of the wrong type is taken out of its record (it
    reads as absent, as from a writer that left it out) and counted in ``dropped_values``. So every
    value a record holds has its declared type.

    ``strict=True`` raises ResultError at the first such problem instead, except for a last line cut
    short (no newline, as a writer killed mid-line leaves it): that one is only counted, and
    ``torn_tail`` says so. Each iteration reads the file again and starts the counts afresh.
    """

    def __init__(
        self,
        path: Path,
        *,
        required: Iterable[str] = RECORD_REQUIRED,
        strict: bool = False,
        where: str | None = None,
    ) -> None:
        self.path = path
        self.required = frozenset(required)
        self.strict = strict
        self.where = where or path.name
        self._reset()

    def _reset(self) -> None:
        self.records = 0
        self.bad_lines = 0
        self.first_bad_line: int | None = None
        self.first_bad = ""
        self.torn_tail = False
        self.dropped_values = 0
        self.first_dropped = ""

    def __iter__(self) -> Iterator[RequestRecord]:
        for _, record in self.numbered():
            yield record

    def numbered(self) -> Iterator[tuple[int, RequestRecord]]:
        """(line number, record) of every good line; ResultError when the file cannot be opened."""
        self._reset()
        try:
            fh = open_regular(self.path, follow_links=False)
        except InputFileProblem as err:
            raise ResultError(f"{self.where}: {err}") from None
        required = self.required
        shapes = _field_shapes(RequestRecord)
        with fh:
            for lineno, (raw, ended) in enumerate(_lines(fh), start=1):
                if raw is None:
                    self._bad(lineno, f"longer than {size_text(RECORD_LINE_MAX_BYTES)}", torn=False)
                    continue
                try:
                    data = loads(raw)
                except (ValueError, RecursionError) as err:
                    if raw.strip():  # a blank line is no record, and no bad one either
                        self._bad(lineno, f"bad JSON ({err})", torn=not ended)
                    continue
                if type(data) is dict and required <= data.keys() and _fits(data, shapes):
                    record = cast(RequestRecord, data)  # the common case, checked inline
                else:
                    found = self._record(data, lineno)
                    if found is None:
                        continue
                    record = found
                self.records += 1
                yield lineno, record

    def _record(self, data: Any, lineno: int) -> RequestRecord | None:
        if type(data) is dict and _record_ok(data, self.required):
            return cast(RequestRecord, data)
        where = f"{self.where}: line {lineno}"
        if not isinstance(data, dict):
            self._bad(lineno, f"must be an object, got {_show(data)}", torn=False)
            return None
        try:
            _check_object(
                {k: v for k, v in data.items() if k in self.required}, RequestRecord, "", where, self.required
            )
        except ResultError as err:
            self._bad(lineno, str(err).removeprefix(f"{where}: "), torn=False)
            return None
        fields = _field_shapes(RequestRecord)
        for key in [k for k, v in data.items() if k in fields and not _fits_one(v, fields[k])]:
            try:
                _check(data[key], _hints(RequestRecord)[key], key, where, frozenset())
            except ResultError as err:
                if self.strict:
                    raise
                self.dropped_values += 1
                self.first_dropped = self.first_dropped or str(err)
                del data[key]
        return cast(RequestRecord, data)

    def _bad(self, lineno: int, what: str, *, torn: bool) -> None:
        if self.strict and not torn:
            raise ResultError(f"{self.where}: line {lineno}: {what}")
        self.bad_lines += 1
        self.torn_tail = torn
        if self.first_bad_line is None:
            self.first_bad_line = lineno
            self.first_bad = f"line {lineno}: {what}"


# How much of requests.jsonl is read at a time (its lines are then split in C, not read one by one).
READ_CHUNK_BYTES = 1 << 20


def _lines(fh: Any) -> Iterator[tuple[bytes | None, bool]]:
    """(line without its newline, whether a newline ended it) for every line of the file; a line
    longer than RECORD_LINE_MAX_BYTES is (None, True), skipped without holding it. Only the last
    line can lack its newline (a writer stopped mid-line)."""
    limit = RECORD_LINE_MAX_BYTES
    carry = b""  # the start of a line not ended yet
    overlong = False  # that line is already past the limit: its bytes are dropped
    while chunk := fh.read(READ_CHUNK_BYTES):
        pieces = chunk.split(b"\n")
        tail = pieces.pop()  # after the chunk's last newline: the start of the next line
        if pieces:
            if overlong:
                yield None, True
            else:
                line = carry + pieces[0] if carry else pieces[0]
                yield (line if len(line) <= limit else None), True
            for i in range(1, len(pieces)):
                piece = pieces[i]
                yield (piece if len(piece) <= limit else None), True
            carry, overlong = b"", False
        if not overlong:
            carry += tail
            if len(carry) > limit:
                carry, overlong = b"", True
    if overlong:
        yield None, True
    elif carry:
        yield carry, False


def read_records(path: Path, *, required: Iterable[str] = RECORD_REQUIRED) -> list[RequestRecord]:
    """Every good record of a requests.jsonl, as a list (for files known to be small; bad lines are
    skipped, see RecordReader)."""
    return list(RecordReader(path, required=required))


def write_records(path: Path, records: Iterable[RequestRecord]) -> int:
    """Write ``records`` as a new requests.jsonl (one compact JSON object per line); returns the count.

    For clients that have every record at the end (the replayer appends its own as they finish).
    """
    count = 0
    with open(path, "wb") as fh:
        for record in records:
            fh.write(dumps(record) + b"\n")
            count += 1
    return count
