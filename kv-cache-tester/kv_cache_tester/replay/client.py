"""Streaming OpenAI-compatible client: send one request, time its stream, classify its failure.

The hot path is kept lean on purpose: the request body arrives pre-encoded and leaves with its head in
one write; the response is decoded by the connection as the socket is read (``replay/http.py``),
and each read's bytes reach ``StreamTimer.feed`` with the clock reading taken when they arrived; SSE
events are split with C-level byte operations (linear in the bytes received) and each is parsed once
by the fastest JSON parser available. The protocol is checked strictly: a 200 that is not an event
stream, an event that is not a JSON object, data after ``[DONE]``, an event longer than the bound or
bytes that are not HTTP end the request as a ``protocol`` error; usage figures that cannot be true
(negative counts, cached tokens above prompt tokens) make it a ``bad_usage`` error, with the figures
kept. TTFT is taken at the first event carrying a non-empty content, reasoning or text delta; E2E at
the last such event, so a trailing usage chunk or ``[DONE]`` never lengthens it. Every event is timed
by the read that completed it. An event may carry ``sim_timeline``, the request's own timeline in the
engine's clock (the simulated engine states it on its last chunk); it is kept as ``Outcome.engine``,
and one that is not well formed is a ``protocol`` error. Real engines send none.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kv_cache_tester.replay.http import BadResponse, ConnectError, Disconnected, HttpError, RequestEndpoint
from kv_cache_tester.replay.jsonfast import loads
from kv_cache_tester.replay.results import EngineTimes, ItlSummary

Clock = Callable[[], float]

# A delta with a non-empty string value for one of the keys engines stream tokens in.
_TOKEN_RE = re.compile(rb'"(?:content|reasoning_content|reasoning|text)"\s*:\s*"(?!")')
_CONTEXT_RE = re.compile(
    r"context length|context window|maximum context|too many tokens|prompt is too long|"
    r"exceeds? the max|longer than the maximum|max_model_len",
    re.IGNORECASE,
)
ERROR_BODY_LIMIT = 2000
MAX_EVENT_BYTES = 4 << 20  # default bound on one SSE event (--max-event-bytes)

# Only these count towards the circuit breaker: a server that answers, however badly, is up.
CONNECTION_CLASSES = frozenset({"connect", "stream_cut"})
HTTP_ERROR_BODY_LIMIT = 64 << 10  # of an error response's body, kept to classify it


@dataclass(slots=True)
class Outcome:
    """What one request produced. Times are seconds on the client clock, relative to the send."""

    ok: bool = False
    ttft: float | None = None
    e2e: float | None = None
    itls: list[float] = field(default_factory=list)
    token_events: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    usage: dict[str, Any] | None = None  # the usage figures as reported (kept for a bad_usage error)
    retries: int = 0  # sends again after a stale keep-alive connection (at most 1)
    accepted: bool = False  # the engine took the request: a 200 event stream (then a token or usage)
    engine: EngineTimes | None = None  # the timeline the engine stated (``sim_timeline``), if any

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.token_events

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        if self.ttft is None or self.e2e is None or n < 2:
            return None
        return (self.e2e - self.ttft) / (n - 1)


def classify_http(status: int, body: str) -> str:
    if status in (400, 413, 422) and _CONTEXT_RE.search(body):
        return "context_length"
    return f"http_{status}"


def _error_message(obj: Any) -> str:
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    return str(obj)


class StreamTimer:
    """Consumes raw SSE bytes as they arrive and keeps the timings of one response.

    ``feed`` is called with each network read and the clock reading taken right after it;
    events read together share that time (that is what the client really observed). Parsing is
    linear in the bytes received: an incomplete event waits in a buffer that only grows, and only
    the new bytes are searched for the event's end. That buffer never holds more than
    ``max_event`` bytes: a longer event ends the response as a ``protocol`` error.
    """

    __slots__ = (
        "_cr",
        "_debug",
        "_last",
        "_max_event",
        "_pending",
        "_t0",
        "_tfeed",
        "broken",
        "cm",
        "done",
        "expired",
        "on_accept",
        "out",
        "responded",
        "usage_problem",
    )

    def __init__(
        self, t0: float, debug: list[tuple[float, bytes]] | None = None, max_event: int = MAX_EVENT_BYTES
    ) -> None:
        self._t0 = t0
        self._pending = bytearray()  # the start of an event whose end has not arrived yet
        self._cr = False  # the previous read ended in a CR (maybe half of a CRLF)
        self._last = 0.0
        self._tfeed = t0
        self._debug = debug
        self._max_event = max_event
        self.done = False  # [DONE] seen
        self.responded = False  # the response's headers came: the request is never sent again
        self.broken = False  # a protocol error: stop reading
        self.cm: asyncio.Timeout | None = None  # the request's deadline, while the request is in flight
        self.expired: tuple[str, str] | None = None  # (class, message) when ended from outside
        self.usage_problem: str | None = None
        self.on_accept: Callable[[], None] | None = None  # called once, when the engine took the request
        self.out = Outcome()

    @property
    def started(self) -> bool:
        """Whether any body bytes have arrived."""
        return self._tfeed != self._t0

    @property
    def idle_since(self) -> float:
        """Clock reading of the newest read (the send time before the first one)."""
        return self._tfeed

    def expire(self, error_class: str, message: str) -> bool:
        """End this request now (the run's stall watchdog, or abandonment at the run's end): it
        fails with ``error_class``. Returns False when it can no longer be ended that way."""
        cm = self.cm
        if cm is None or self.expired is not None:
            return False
        try:
            cm.reschedule(asyncio.get_running_loop().time())
        except RuntimeError:  # already expiring or left
            return False
        self.expired = (error_class, message)
        return True

    def accept(self) -> None:
        """The server has shown that it took the request (its prefill happened)."""
        out = self.out
        if not out.accepted:
            out.accepted = True
            if self.on_accept is not None:
                self.on_accept()

    def _protocol(self, message: str) -> None:
        if self.broken:
            return
        self.broken = True
        out = self.out
        out.error_class = "protocol"
        out.error_message = message[:ERROR_BODY_LIMIT]

    def feed(self, data: bytes, now: float) -> bool:
        """Take the bytes of one read; False once a protocol error says to read no further."""
        self._tfeed = now
        if self._debug is not None:
            self._debug.append((now - self._t0, data))
        if self.broken:
            return False
        if (
            not self._pending
            and not self._cr
            and data.endswith(b"\n\n")
            and len(data) <= self._max_event
            and b"\r" not in data
        ):  # whole events, the usual read: no buffer, no line-end rewriting
            if data.find(b"\n\n") == len(data) - 2:
                self._events((data,), now)
            else:
                events = data.split(b"\n\n")
                events.pop()
                self._events(events, now)
            return not self.broken
        self._feed_any(data, now)
        return not self.broken

    def _feed_any(self, data: bytes, now: float) -> None:
        """``feed`` in full: events split anywhere, CRLF line ends, an event over the bound."""
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
            if data.endswith(b"\r"):  # a CRLF split across reads: keep the CR for the next read
                data = data[:-1]
                self._cr = True
        pending = self._pending
        if pending:
            start = len(pending) - 1  # the blank line may begin with the buffer's last byte
            pending += data
            end = pending.find(b"\n\n", start)
            if end < 0:
                if len(pending) > self._max_event:
                    self._too_long(len(pending))
                return
            first = bytes(pending[:end])
            data = bytes(pending[end + 2 :])
            self._pending = bytearray()
            if len(first) > self._max_event:
                self._too_long(len(first))
                return
            self._events((first,), now)
        events = data.split(b"\n\n")
        tail = events.pop()
        if len(data) > self._max_event and any(len(ev) > self._max_event for ev in events):
            self._too_long(max(len(ev) for ev in events))
            return
        self._events(events, now)
        if tail and not self.broken:
            if len(tail) > self._max_event:
                self._too_long(len(tail))
            else:
                self._pending += tail

    def _too_long(self, size: int) -> None:
        self._pending = bytearray()
        self._protocol(f"an SSE event longer than {self._max_event} bytes ({size} bytes without its end)")

    def _events(self, events: Iterable[bytes], now: float) -> None:
        """The whole events of one read, in order (each without its blank line, or with it)."""
        # The hot path: one pass per event, with what every event needs held in locals; the order
        # of the checks is a token event's (byte scans of the payload cost more than dict look-ups).
        out = self.out
        t = now - self._t0
        for ev in events:
            if self.broken:
                return
            if ev.startswith(b"data:"):
                payload = ev[5:]
            else:
                idx = ev.find(b"data:")
                if idx < 0:
                    continue  # comment / keep-alive / event-name-only lines
                payload = ev[idx + 5 :]
            if self.done:
                if _data_of(ev).strip():
                    self._protocol(f"data after [DONE]: {_excerpt(_data_of(ev).strip())}")
                continue
            try:
                obj = loads(payload)
            except ValueError:
                obj = self._not_json(ev, payload)
                if obj is None:
                    continue
            if obj.__class__ is not dict:
                self._protocol(f"an SSE event that is not a JSON object: {_excerpt(payload.strip())}")
                return
            choices = obj.get("choices")
            if choices:
                try:
                    choice = choices[0]
                    delta = choice.get("delta")
                    if delta is None:
                        token = choice.get("text")
                    else:
                        token = (
                            delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                        )
                except (AttributeError, KeyError, IndexError, TypeError):
                    token = None  # not the shape of a token event
                if token:
                    if out.ttft is None:
                        out.ttft = t
                        self.accept()
                    else:
                        out.itls.append(t - self._last)
                    self._last = t
                    out.token_events += 1
            usage = obj.get("usage")
            if usage is not None:
                self._usage(usage)
            timeline = obj.get("sim_timeline")
            if timeline is not None:
                self._timeline(timeline)
            if "error" in obj or obj.get("object") == "error":
                if obj.get("error") is None and obj.get("object") != "error":
                    continue
                msg = _error_message(obj)
                out.error_class = "context_length" if _CONTEXT_RE.search(msg) else "stream_error"
                out.error_message = msg[:ERROR_BODY_LIMIT]

    def _not_json(self, ev: bytes, payload: bytes) -> Any:
        """An event whose first data line is not JSON: its data lines together (the SSE rules in
        full), else ``[DONE]`` or a protocol error (then None)."""
        if b"\n" in payload.rstrip(b"\n"):  # more lines after the first data line
            try:
                return loads(_data_of(ev))
            except ValueError:
                payload = _data_of(ev)
        payload = payload.strip()
        if payload == b"[DONE]":
            self.done = True
        elif payload:
            self._protocol(f"an SSE event that is not JSON: {_excerpt(payload)}")
        return None

    def _usage(self, usage: object) -> None:
        """Keep the usage figures; note (once) any that cannot be true."""
        if type(usage) is not dict:
            self.out.usage = {"usage": _short(usage)}
            self.usage_problem = self.usage_problem or "usage is not a JSON object"
            return
        details = usage.get("prompt_tokens_details")
        raw = {
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "cached_tokens": details.get("cached_tokens") if type(details) is dict else None,
        }
        out = self.out
        problems = []
        for key, value in raw.items():
            if value is None:
                continue
            if type(value) is not int:
                problems.append(f"{key} is not an integer: {_short(value)}")
                raw[key] = _short(value)
                continue
            if value < 0:
                problems.append(f"{key} is negative: {value}")
            if key == "prompt_tokens":
                out.prompt_tokens = value
                if value > 0:
                    self.accept()  # the server counted the prompt: it was prefilled
            elif key == "completion_tokens":
                out.completion_tokens = value
            else:
                out.cached_tokens = value
        prompt, cached = raw["prompt_tokens"], raw["cached_tokens"]
        if type(prompt) is int and type(cached) is int and cached > prompt:
            problems.append(f"cached_tokens {cached} > prompt_tokens {prompt}")
        out.usage = raw
        if problems and self.usage_problem is None:
            self.usage_problem = "; ".join(problems)

    def _timeline(self, timeline: object) -> None:
        """Keep the engine's own timeline of the request (``sim_timeline``), or end the response as a
        ``protocol`` error when it is not one."""
        try:
            self.out.engine = engine_times(timeline)
        except ValueError as err:
            self._protocol(f"sim_timeline: {err}")

    def finish(self) -> Outcome:
        """Close the response: decide ok/error from what was seen."""
        if self._pending.strip() and not self.broken:
            ev, self._pending = bytes(self._pending), bytearray()
            self._events((ev,), self._tfeed)
        out = self.out
        if out.ttft is not None:
            out.e2e = self._last
        if out.error_class is not None:
            return out
        if out.ttft is None:
            out.error_class = "empty_stream" if self.done else "stream_cut"
            out.error_message = (
                "stream ended without a content token"
                if self.done
                else "stream closed before any content token"
            )
            return out
        if not self.done:
            out.error_class = "stream_cut"
            out.error_message = f"stream closed after {out.token_events} token events without [DONE]"
            return out
        if self.usage_problem is not None:
            out.error_class = "bad_usage"
            out.error_message = f"usage figures that cannot be true: {self.usage_problem}"[:ERROR_BODY_LIMIT]
            return out
        out.ok = True
        return out


def _number(obj: Mapping[str, Any], key: str, *, null: bool = False) -> Any:
    value = obj.get(key)
    if value is None and null:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{key} must be a finite number >= 0, got {_short(value)}")
    return value


def _count(obj: Mapping[str, Any], key: str, name: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {_short(value)}")
    return value


def engine_times(timeline: object) -> EngineTimes:
    """The fields of a ``sim_timeline`` object the record keeps; ValueError naming the field when
    it is not well formed (docs/engine-sim.md lists the fields)."""
    if type(timeline) is not dict:
        raise ValueError(f"must be a JSON object, got {_short(timeline)}")
    itl = timeline.get("itl_s")
    if type(itl) is not dict:
        raise ValueError(f"itl_s must be a JSON object, got {_short(itl)}")
    n = _count(itl, "n", "itl_s.n")
    tokens = _count(timeline, "output_tokens", "output_tokens")
    speed = _number(timeline, "speed")
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed!r}")
    itls: ItlSummary = {
        "mean": _number(itl, "mean", null=True),
        "p50": _number(itl, "p50", null=True),
        "p99": _number(itl, "p99", null=True),
        "max": _number(itl, "max", null=True),
        "n": n,
    }
    return {
        "ttft_s": _number(timeline, "ttft_s", null=True),
        "e2e_s": _number(timeline, "e2e_s"),
        "tpot_s": _number(timeline, "tpot_s", null=True),
        "itl_s": itls,
        "output_tokens": tokens,
        "speed": speed,
    }


def _data_of(ev: bytes) -> bytes:
    """The data of an SSE event with several lines: its data lines' values, joined by newlines."""
    return b"\n".join(line[5:].removeprefix(b" ") for line in ev.split(b"\n") if line.startswith(b"data:"))


def _excerpt(payload: bytes, n: int = 200) -> str:
    text = payload[:n].decode("utf-8", "replace")
    return repr(text) + (f" ... ({len(payload)} bytes)" if len(payload) > n else "")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:64] + "..."


async def send(
    endpoint: RequestEndpoint,
    body: bytes,
    headers: Mapping[str, str],
    timeout: float | None,
    clock: Clock = time.perf_counter,
    debug: list[tuple[float, bytes]] | None = None,
    watch: set[StreamTimer] | None = None,
    max_event: int = MAX_EVENT_BYTES,
    on_accept: Callable[[], None] | None = None,
    retry_stale: bool = True,
) -> Outcome:
    """POST one streaming request to ``endpoint`` and time it. Never raises for server or network
    trouble.

    ``timeout`` (seconds, None: none) bounds the whole request, with one ``asyncio.timeout``. While
    the request is in flight its timer is in ``watch``, where the run can end it
    (``StreamTimer.expire``). ``clock`` starts the request's times; the endpoint's clock, which
    stamps the reads, must be the same.

    The stale-connection retry (``retry_stale``): a request whose reused keep-alive connection was
    closed by the server before any byte of the response came back (the end of the stream, or a
    reset or broken pipe) is sent once more, on a new connection that is closed after it;
    ``Outcome.retries`` counts it. A request sent on a new connection, or one that got any byte of a
    response, is never sent again. ``on_accept`` is called once, when the engine has shown that it took
    the request: a 200 event-stream response (or, from a looser server, a token or a prompt count).
    """
    timer = StreamTimer(clock(), debug, max_event)
    timer.on_accept = on_accept
    try:
        async with asyncio.timeout(timeout) as cm:
            if watch is not None:
                timer.cm = cm
                watch.add(timer)
            try:
                response = await _exchange(endpoint, endpoint.request(body, headers), timer, retry_stale)
            finally:
                if watch is not None:
                    watch.discard(timer)
    except (TimeoutError, HttpError) as exc:
        return _failed(timer, exc, timeout)
    response.judge()
    return timer.finish()


async def _exchange(
    endpoint: RequestEndpoint, request: list[bytes], timer: StreamTimer, retry_stale: bool
) -> _Response:
    """Send the request and read its response into ``timer``; once more on a new connection when a
    stale keep-alive connection lost it (``send`` says when)."""
    retries = 0
    while True:
        conn = await endpoint.connection(fresh=retries > 0)
        response = _Response(timer)
        try:
            await conn.exchange(request, response)
        except Disconnected as exc:
            endpoint.release(conn)
            if (
                timer.responded
                or exc.responded
                or retries
                or not retry_stale
                or not conn.reused
                or not exc.stale
            ):
                raise
            retries += 1  # a stale keep-alive connection: once more, on a new one
            timer.out.retries = retries
            continue
        except BaseException:
            endpoint.release(conn)
            raise
        endpoint.release(conn)
        return response


class _Response:
    """One response, as its connection reads it: an event stream goes to the timer as it arrives;
    of anything else the start is kept, to say what it was."""

    __slots__ = ("_ctype", "_kept", "_limit", "_status", "_timer")

    def __init__(self, timer: StreamTimer) -> None:
        self._timer = timer
        self._status = 0
        self._ctype = ""
        self._kept = bytearray()
        self._limit = 0  # bytes of a non-stream body to keep; 0 while the body is an event stream

    def head(self, status: int, headers: Mapping[str, str]) -> Callable[[bytes, float], bool]:
        timer = self._timer
        timer.responded = True
        self._status = status
        self._ctype = headers.get("content-type", "")
        if status != 200:
            self._limit = HTTP_ERROR_BODY_LIMIT
        elif not self._ctype.lower().startswith("text/event-stream"):
            self._limit = ERROR_BODY_LIMIT
        else:
            timer.accept()  # a 200 event stream: the engine took the request
            return timer.feed  # its bytes go straight to the SSE reader
        return self._keep

    def _keep(self, data: bytes, now: float) -> bool:
        kept = self._kept
        kept += data[: self._limit - len(kept)]
        return self._status != 200 or len(kept) < self._limit  # an error's body: read it to its end

    def judge(self) -> None:
        """After the response: the failure of one that was not an event stream."""
        out = self._timer.out
        raw = bytes(self._kept)
        if self._status != 200:
            text = raw.decode("utf-8", "replace")
            out.error_class = classify_http(self._status, text)
            try:
                msg = _error_message(loads(raw))
            except ValueError:
                msg = text
            out.error_message = f"HTTP {self._status}: {msg}"[:ERROR_BODY_LIMIT]
        elif self._limit:
            out.error_class = "protocol"
            out.error_message = (
                f"HTTP 200 with Content-Type {self._ctype!r}, not an event stream: {_excerpt(raw)}"
            )[:ERROR_BODY_LIMIT]


def _failed(timer: StreamTimer, exc: BaseException, total: float | None) -> Outcome:
    """The outcome of a request that ``exc`` ended: its class and message, the times seen so far."""
    out = timer.out
    if isinstance(exc, TimeoutError):
        if timer.expired is not None:
            out.error_class, out.error_message = timer.expired
        else:
            out.error_class = "timeout"
            out.error_message = f"no complete response within {total} s"
    elif isinstance(exc, ConnectError):
        out.error_class = "connect"
        out.error_message = str(exc)
    elif isinstance(exc, BadResponse):
        out.error_class = "protocol"
        out.error_message = f"not an HTTP/1.1 response: {exc}"
    else:
        out.error_class = "stream_cut" if timer.responded else "connect"
        out.error_message = f"{type(exc).__name__}: {exc}"
    out.ok = False
    if out.ttft is not None:
        out.e2e = timer._last
    out.error_message = (out.error_message or "")[:ERROR_BODY_LIMIT]
    return out
