"""Token times are taken when the bytes reach the client, not when the client gets round to them."""

from __future__ import annotations

import asyncio
import functools
import json
import time

import aiohttp
import pytest
from kv_cache_tester.replay.arrival import ArrivalConnector, ArrivalStampedHandler
from kv_cache_tester.replay.client import send

BUSY_S = 0.05


class BusyAfterTokens(ArrivalStampedHandler):
    """A client that is busy (other streams, bookkeeping) right after a token's bytes arrive."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if b" tok" in data:
            time.sleep(BUSY_S)


class BusyConnector(ArrivalConnector):
    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._factory = functools.partial(BusyAfterTokens, loop=self._loop)


def _ttft(url: str, clock) -> float:
    async def go() -> float:
        body = json.dumps(
            {"messages": [{"role": "user", "content": "a b c"}], "max_tokens": 1, "stream": True}
        )
        async with aiohttp.ClientSession(connector=BusyConnector()) as session:
            out = await send(session, url, body.encode(), {}, aiohttp.ClientTimeout(total=10), clock)
        assert out.ok, out.error_message
        assert out.ttft is not None
        return out.ttft

    return asyncio.run(go())


@pytest.mark.integration
def test_ttft_is_stamped_at_arrival_not_after_the_client_was_busy(stream_server):
    server = stream_server("--ttft-ms", "20")
    url = f"{server.url}/v1/chat/completions"
    stamped = _ttft(url, time.perf_counter)
    read_late = _ttft(url, lambda: time.perf_counter())  # another clock: arrival stamps not used
    assert 0.015 <= stamped < BUSY_S
    assert read_late >= stamped + BUSY_S * 0.9


@pytest.mark.integration
def test_the_connector_builds_arrival_stamping_connections(stream_server):
    # the body comes later than the headers: a response read to its end at once gives its
    # connection back, and r.connection is None then
    server = stream_server("--ttft-ms", "300")

    async def go() -> None:
        body = {"prompt": "x", "max_tokens": 2, "stream": True}
        async with (
            aiohttp.ClientSession(connector=ArrivalConnector()) as session,
            session.post(f"{server.url}/v1/completions", json=body) as r,
        ):
            proto = r.connection.protocol if r.connection else None
            assert isinstance(proto, ArrivalStampedHandler)
            await r.read()
            assert r.status == 200 and proto.arrived > 0

    asyncio.run(go())


def test_a_read_spanning_several_arrivals_times_each_event_by_the_read_that_completed_it():
    from kv_cache_tester.replay.client import StreamTimer

    loop = asyncio.new_event_loop()
    try:
        proto = ArrivalStampedHandler(loop=loop)
        body = object()
        ev1 = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        ev2 = b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n'
        # ev1 and the first half of ev2 arrived at 10.0, the rest of ev2 at 10.5; an older response's
        # arrival on the same connection is ignored; the reader only gets to the bytes at 11.0.
        half = len(ev1) + 10
        proto.marks = [(object(), 9.0, 5), (body, 10.0, half), (body, 10.5, len(ev1 + ev2))]
        proto.arrived = 10.5
        pieces = proto.split(body, ev1 + ev2, len(ev1 + ev2))
        assert [t for _, t in pieces] == [10.0, 10.5]
        assert b"".join(p for p, _ in pieces) == ev1 + ev2
        timer = StreamTimer(t0=9.9)
        for piece, t in pieces:
            timer.feed(piece, t)
        assert round(timer.out.ttft, 6) == 0.1 and [round(x, 6) for x in timer.out.itls] == [0.5]
        assert proto.marks == []
    finally:
        loop.close()
