"""Stamp every network read with the moment it reached the client, not when the client got to it.

With many users streaming at once, a chunk that has arrived waits in the event loop behind the
other streams' chunks before the coroutine reading it runs; a clock read there adds that queue to
the token's time. :class:`ArrivalConnector` gives each connection a protocol that reads the clock in
its receive callback (``data_received``, called as the socket is read) and notes how far the
response body had been received at that moment. :meth:`ArrivalStampedHandler.split` then cuts what
the reader got into the pieces that arrived together, each with its arrival time, so an SSE event is
timed by the read that completed it.
"""

from __future__ import annotations

import functools
import time
from typing import Any, cast

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.streams import StreamReader

MAX_MARKS = 4096  # arrivals kept for a reader that does not collect them (memory bound)
_clock = time.perf_counter


class ArrivalStampedHandler(ResponseHandler):
    arrived = 0.0  # clock of the newest read

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks: list[tuple[object, float, int]] = []  # (body stream, clock, its bytes so far)

    def data_received(self, data: bytes) -> None:
        # aiohttp also calls this with b"" when the reader drains its buffer, to parse bytes it held
        # back: those arrived with the newest real read, so they keep its time.
        t = _clock() if data else self.arrived
        payload = self._payload  # the body stream of the response being read (None: headers)
        before = payload.total_bytes if payload is not None else -1
        ResponseHandler.data_received(self, data)
        self.arrived = t
        payload = self._payload
        if payload is not None and payload.total_bytes != before:
            marks = self.marks
            if len(marks) >= MAX_MARKS:
                del marks[: MAX_MARKS // 2]
            marks.append((payload, t, payload.total_bytes))

    def split(self, content: object, data: bytes, end: int) -> list[tuple[bytes, float]]:
        """``data``, body bytes ``[end - len(data), end)`` of ``content``, as (piece, arrival) pairs."""
        marks = self.marks
        if len(marks) == 1:  # the usual case: one read brought all of it
            payload, t, total = marks[0]
            if payload is content and total == end:
                marks.clear()
                return [(data, t)]
        self.marks = []
        start = end - len(data)
        out: list[tuple[bytes, float]] = []
        pos = 0
        for payload, t, total in marks:
            if payload is not content or total <= start:
                continue  # another (earlier) response on this connection, or already read
            if total > end:
                self.marks.append((payload, t, total))  # not read yet
                continue
            cut = total - start
            if cut > pos:
                out.append((data[pos:cut] if pos or cut < len(data) else data, t))
                pos = cut
        if pos < len(data):
            out.append((data[pos:] if pos else data, self.arrived))
        return out


class ArrivalConnector(aiohttp.TCPConnector):
    """A TCP connector whose connections record when their data arrives."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # The protocol factory every connection is built with, and the handler attributes the stamps
        # rely on; an aiohttp without them gets plain connections (times read by the reader).
        probe = ResponseHandler(loop=self._loop)
        if hasattr(self, "_factory") and hasattr(probe, "_payload") and hasattr(StreamReader, "total_bytes"):
            stamped = functools.partial(ArrivalStampedHandler, loop=self._loop)
            self._factory = cast("functools.partial[ResponseHandler]", stamped)  # a subclass's factory


def arrival_of(resp: aiohttp.ClientResponse) -> ArrivalStampedHandler | None:
    """The response's connection protocol, when it stamps arrivals."""
    conn = resp.connection
    proto = conn.protocol if conn is not None else None
    return proto if isinstance(proto, ArrivalStampedHandler) else None
