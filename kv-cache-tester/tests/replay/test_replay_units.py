"""Trace pool, timing strategies, statistics and the circuit breaker."""

from __future__ import annotations

import asyncio
import socket

import pytest
from kv_cache_tester.replay import itl_summary
from kv_cache_tester.replay.breaker import CircuitBreaker
from kv_cache_tester.replay.pool import TracePool
from kv_cache_tester.replay.timing import raw_delay, scaled_delay
from kv_cache_tester.stats import LogHistogram, distribution, percentile
from kv_cache_tester.traces.model import Request


def req(t: float, think: float = 0.0, api: float = 0.0) -> Request:
    return Request(index=0, t=t, in_tokens=64, out_tokens=1, hash_ids=[1], think_time=think, api_time=api)


def test_pool_is_deterministic_and_never_leases_a_live_trace():
    a = TracePool(list(range(10)), seed=7, recycle=True)
    b = TracePool(list(range(10)), seed=7, recycle=True)
    first = [a.lease() for _ in range(10)]
    assert first == [b.lease() for _ in range(10)]
    assert sorted(i for i, _ in first) == list(range(10))
    assert a.lease() is None  # all ten live: nothing to hand out
    a.release(first[3][0])
    assert a.lease() == (first[3][0], 1)  # second play of the only free trace


def test_pool_without_recycle_plays_each_trace_once():
    pool = TracePool([0, 1], seed=0, recycle=False)
    x, y = pool.lease(), pool.lease()
    assert x and y
    pool.release(x[0])
    assert pool.lease() is None


def test_pool_recycle_prefers_unused_traces():
    pool = TracePool([0, 1, 2], seed=0, recycle=True)
    i0, _ = pool.lease()  # type: ignore[misc]
    pool.release(i0)
    nxt = [pool.lease() for _ in range(2)]
    assert all(play == 0 for _, play in nxt)  # type: ignore[misc]
    assert pool.lease() == (i0, 1)


def test_timing_strategies():
    prev, cur = req(10.0, api=4.0), req(20.0, think=3.0)
    assert raw_delay("think-only", cur, prev) == 3.0
    assert raw_delay("original", cur, prev) == 10.0
    assert raw_delay("api-scaled", cur, prev, api_time_scale=0.5) == 2.0 + 3.0
    assert scaled_delay("original", cur, prev, max_delay=6.0, time_scale=0.1) == pytest.approx(0.6)
    assert scaled_delay("original", cur, prev, max_delay=0.0, time_scale=1.0) == 0.0


def test_percentiles_and_histogram():
    data = [float(i) for i in range(1, 101)]
    assert percentile(data, 50) == pytest.approx(50.5)
    assert percentile([], 50) is None
    d = distribution([])
    assert d["p99.9"] is None and d["mean"] is None
    assert itl_summary([0.3, 0.1, 0.2]) == {
        "mean": pytest.approx(0.2),
        "p50": 0.2,
        "p99": pytest.approx(0.298),
        "max": 0.3,
        "n": 3,
    }
    h = LogHistogram()
    h.add_many([0.001 * i for i in range(1, 1001)])
    assert h.percentile(50) == pytest.approx(0.5, rel=0.02)
    assert h.percentile(99) == pytest.approx(0.99, rel=0.02)
    assert h.distribution()["mean"] == pytest.approx(0.5005)


@pytest.mark.integration
def test_breaker_trips_on_a_dead_port_and_resets_on_success():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def go() -> tuple[list[str], CircuitBreaker]:
        tripped: list[str] = []
        br = CircuitBreaker("127.0.0.1", port, tripped.append, threshold=3, window=0.3)
        br.observe("connect")
        br.observe(None)  # a success resets the count
        assert br.consecutive == 0
        br.observe("http_500")  # not a connection error
        assert br.consecutive == 0
        br.observe("connect")  # the probe takes it from here
        for _ in range(50):
            if tripped:
                break
            await asyncio.sleep(0.05)
        br.close()
        return tripped, br

    tripped, br = asyncio.run(go())
    assert tripped and "circuit breaker" in tripped[0] and br.consecutive >= 3


@pytest.mark.integration
def test_breaker_probe_resets_when_the_server_answers():
    async def go() -> CircuitBreaker:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        br = CircuitBreaker("127.0.0.1", port, lambda m: None, threshold=3, window=0.2)
        br.observe("stream_cut")
        await asyncio.sleep(0.3)
        server.close()
        br.close()
        return br

    br = asyncio.run(go())
    assert br.tripped is None and br.consecutive == 0
