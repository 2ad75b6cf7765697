"""Streaming OpenAI-compatible client: send one request, time its stream, classify its failure.

The hot path is kept lean on purpose: the request body arrives pre-encoded, SSE events are split
with C-level byte operations, a token event is recognised by one regular-expression search, and
only the (rare) usage or error events are JSON-parsed. TTFT is taken at the first event carrying a
non-empty content, reasoning or text delta; E2E at the last such event, so a trailing usage chunk
or ``[DONE]`` never lengthens it. Times are those at which the bytes reached the client's
connection (``arrival``), when the session's connector stamps them.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kv_cache_tester.replay.arrival import arrival_of
from kv_cache_tester.replay.jsonfast import loads

Clock = Callable[[], float]

# A delta with a non-empty string value for one of the keys engines stream tokens in.
_TOKEN_RE = re.compile(rb'"(?:content|reasoning_content|reasoning|text)"\s*:\s*"(?!")')
_CONTEXT_RE = re.compile(
    r"context length|context window|maximum context|too many tokens|prompt is too long|"
    r"exceeds? the max|longer than the maximum|max_model_len",
    re.IGNORECASE,
)
ERROR_BODY_LIMIT = 2000

CONNECTION_CLASSES = frozenset({"connect", "stream_cut"})
_NO_AIOHTTP_TIMEOUT = aiohttp.ClientTimeout()  # send() enforces the request timeout itself


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
    events read together share that time (that is what the client really observed).
    """

    __slots__ = ("_buf", "_debug", "_last", "_t0", "_tfeed", "done", "out")

    def __init__(self, t0: float, debug: list[tuple[float, bytes]] | None = None) -> None:
        self._t0 = t0
        self._buf = b""
        self._last = 0.0
        self._tfeed = t0
        self._debug = debug
        self.done = False
        self.out = Outcome()

    def feed(self, data: bytes, now: float) -> None:
        self._tfeed = now
        if self._debug is not None:
            self._debug.append((now - self._t0, data))
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
            if buf.endswith(b"\r"):  # a CRLF split across reads: keep the CR for the next read
                self._buf = buf
                return
        events = buf.split(b"\n\n")
        self._buf = events.pop()
        for ev in events:
            self._event(ev, now)

    def _event(self, ev: bytes, now: float) -> None:
        idx = ev.find(b"data:")
        if idx < 0:
            return  # comment / keep-alive / event-name-only line
        payload = ev[idx + 5 :].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        out = self.out
        if _TOKEN_RE.search(payload) is not None:
            t = now - self._t0
            if out.ttft is None:
                out.ttft = t
            else:
                out.itls.append(t - self._last)
            self._last = t
            out.token_events += 1
            if b'"usage":{' not in payload and b'"usage": {' not in payload:
                return
        if b'"usage"' in payload:
            self._usage(payload)
        elif b'"error"' in payload:
            try:
                obj = loads(payload)
            except ValueError:
                return
            if isinstance(obj, dict) and (obj.get("error") is not None or obj.get("object") == "error"):
                msg = _error_message(obj)
                out.error_class = "context_length" if _CONTEXT_RE.search(msg) else "stream_error"
                out.error_message = msg[:ERROR_BODY_LIMIT]

    def _usage(self, payload: bytes) -> None:
        try:
            obj = loads(payload)
        except ValueError:
            return
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if not isinstance(usage, dict):
            return
        out = self.out
        if isinstance(usage.get("prompt_tokens"), int):
            out.prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            out.completion_tokens = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            out.cached_tokens = details["cached_tokens"]

    def finish(self) -> Outcome:
        """Close the response: decide ok/error from what was seen."""
        if self._buf.strip():
            self._event(self._buf, self._tfeed)
            self._buf = b""
        out = self.out
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
            out.e2e = self._last
            return out
        out.e2e = self._last
        out.ok = True
        return out


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout: aiohttp.ClientTimeout,
    clock: Clock = time.perf_counter,
    debug: list[tuple[float, bytes]] | None = None,
) -> Outcome:
    """POST one streaming request and time it. Never raises for server or network trouble.

    ``timeout.total`` bounds the whole request. It is enforced with one ``asyncio.timeout`` rather
    than by aiohttp, whose timer is entered and left around every read of the stream.
    """
    t0 = clock()
    timer = StreamTimer(t0, debug)
    got_headers = False
    try:
        async with (
            asyncio.timeout(timeout.total),
            session.post(url, data=body, headers=headers, timeout=_NO_AIOHTTP_TIMEOUT) as resp,
        ):
            got_headers = True
            if resp.status != 200:
                raw = await resp.content.read(64 * 1024)
                text = raw.decode("utf-8", "replace")
                out = timer.out
                out.error_class = classify_http(resp.status, text)
                try:
                    msg = _error_message(loads(raw))
                except ValueError:
                    msg = text
                out.error_message = f"HTTP {resp.status}: {msg}"[:ERROR_BODY_LIMIT]
                return out
            content = resp.content
            stamped = arrival_of(resp) if clock is time.perf_counter else None
            end = 0
            while True:
                data = await content.readany()
                if not data:
                    break
                if stamped is None:
                    timer.feed(data, clock())
                    continue
                end += len(data)
                if timer.out.ttft is None:  # exact arrival for the first token
                    for piece, t in stamped.split(content, data, end):
                        timer.feed(piece, t)
                else:  # later events read together share the newest arrival (no per-read split)
                    stamped.marks.clear()
                    timer.feed(data, stamped.arrived)
            if stamped is not None:
                stamped.marks.clear()  # the response is read: hold no reference to it
        return timer.finish()
    except TimeoutError:
        out = timer.out
        out.error_class = "timeout"
        out.error_message = f"no complete response within {timeout.total} s"
    except aiohttp.ClientConnectorError as exc:
        out = timer.out
        out.error_class = "connect"
        out.error_message = str(exc)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        out = timer.out
        out.error_class = "stream_cut" if got_headers else "connect"
        out.error_message = f"{type(exc).__name__}: {exc}"
    except aiohttp.ClientError as exc:
        out = timer.out
        out.error_class = "client_error"
        out.error_message = f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError:
        raise
    out.ok = False
    if out.ttft is not None:
        out.e2e = timer._last
    out.error_message = (out.error_message or "")[:ERROR_BODY_LIMIT]
    return out
