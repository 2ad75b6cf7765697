"""Token times are taken when the bytes reach the client, not when the client gets round to them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kv_cache_tester.replay.client import StreamTimer, send
from kv_cache_tester.replay.http import Connection, Endpoint

BUSY_S = 0.05


class BusyAfterTokens(Connection):
    """A client that is busy (other streams, bookkeeping) right after a token's bytes arrive."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if b" tok" in data:
            time.sleep(BUSY_S)


class BusyEndpoint(Endpoint):
    connection_class = BusyAfterTokens


@pytest.mark.integration
def test_ttft_is_stamped_at_arrival_not_after_the_client_was_busy(stream_server):
    server = stream_server("--ttft-ms", "20")

    async def go() -> float:
        body = json.dumps(
            {"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 2, "stream": True}
        )
        endpoint = BusyEndpoint(f"{server.url}/v1/chat/completions")
        try:
            out = await send(endpoint, body.encode(), {}, 10)
        finally:
            endpoint.close()
        assert out.ok, out.error_message
        assert out.ttft is not None
        return out.ttft

    stamped = asyncio.run(go())
    assert 0.015 <= stamped < BUSY_S


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False

    def writelines(self, data: Any) -> None:
        self.written.extend(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0


def test_a_read_spanning_several_arrivals_times_each_event_by_the_read_that_completed_it():
    ev1 = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    ev2 = b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n'
    body = ev1 + ev2 + b"data: [DONE]\n\n"
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)
    # the head, ev1 and the first half of ev2 arrived at 10.0, the rest at 10.5; the client got round
    # to them later (the clock reads 11.0 and on by then)
    half = len(response) + len(ev1) + 10
    arrivals = iter([10.0, 10.5])
    clock = iter(x / 10 for x in range(110, 200))

    class Recorder:
        def __init__(self) -> None:
            self.timer = StreamTimer(t0=9.9)

        def head(self, status: int, headers: object) -> Callable[[bytes, float], bool]:
            assert status == 200
            return self.timer.feed

    async def go() -> StreamTimer:
        conn = Connection(lambda: next(arrivals))
        conn.connection_made(FakeTransport())
        reader = Recorder()
        task = asyncio.ensure_future(conn.exchange([b"POST / HTTP/1.1\r\n\r\n"], reader))
        await asyncio.sleep(0)
        full = response + body
        conn.data_received(full[:half])
        conn.data_received(full[half:])
        next(clock)
        await task
        assert conn.reusable
        return reader.timer

    timer = asyncio.run(go())
    out = timer.finish()
    assert out.ok
    assert round(out.ttft or 0, 6) == 0.1 and [round(x, 6) for x in out.itls] == [0.5]


def _decode(reads: list[bytes]) -> tuple[bytes, bool]:
    """The body a connection hands on for a chunked response read as ``reads``; whether it ended."""
    got: list[bytes] = []

    class Keep:
        def head(self, status: int, headers: object) -> Callable[[bytes, float], bool]:
            return lambda data, now: got.append(data) is None

    async def go() -> bool:
        conn = Connection(time.perf_counter)
        conn.connection_made(FakeTransport())
        task = asyncio.ensure_future(conn.exchange([b"POST / HTTP/1.1\r\n\r\n"], Keep()))
        await asyncio.sleep(0)
        for data in reads:
            conn.data_received(data)
        await asyncio.sleep(0)
        if not task.done():
            task.cancel()
            return False
        await task
        return True

    ended = asyncio.run(go())
    return b"".join(got), ended


@pytest.mark.parametrize(
    "chunks",
    [
        [b"data: a\n\n"] * 5,
        [b"with\r\nline ends\r\n", b"\r\n", b"0\r\n"],  # CRLF inside chunks: not where a split would cut
        [b"x" * 70000, b"y"],
    ],
)
def test_chunks_decode_alike_whole_or_byte_by_byte(chunks: list[bytes]):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n" % len(c) + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    expected = b"".join(chunks)
    assert _decode([head + body]) == (expected, True)
    assert _decode([head, body]) == (expected, True)
    assert _decode([head] + [body[i : i + 1] for i in range(len(body))]) == (expected, True)
    # a last chunk inside a read ends the body there: what follows is not this response's
    assert _decode([head, b"3\r\nabc\r\n0\r\n\r\n5\r\nhello\r\n"]) == (b"abc", True)
