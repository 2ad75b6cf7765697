"""SGLang's --scheduler-recv-interval: while only decodes run, the scheduler takes new requests in once
every N steps; after a step with a prefill, or when idle, at once (its receive skipper)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from agentsweep.engine_sim.kv_cache import KVCache
from agentsweep.engine_sim.profiles import StepCost
from agentsweep.engine_sim.request import SimRequest
from agentsweep.engine_sim.scheduler import FINISHED, Engine, VirtualClock

BS = 16


def _serve(interval: int, after_tokens: int) -> tuple[SimRequest, SimRequest]:
    """A decodes alone; B arrives once A has ``after_tokens`` tokens."""

    async def go() -> tuple[SimRequest, SimRequest]:
        cost = StepCost(2e-3, 1e-7, 1e-7, 0.0)
        engine = Engine(KVCache(1000), cost, VirtualClock(), block_size=BS, recv_interval=interval)
        engine.start()
        try:
            a = engine.submit(list(range(64)), 120)
            while a.generated < after_tokens:  # woken by A's every token, not by polling a wall clock
                a.event.clear()
                await a.event.wait()
            b = engine.submit(list(range(1000, 1064)), 4)
            for r in (a, b):
                while r.status != FINISHED:
                    r.event.clear()
                    await r.event.wait()
            return a, b
        finally:
            await engine.stop()

    return asyncio.run(go())


@pytest.mark.parametrize("interval", [1, 8, 30])
@pytest.mark.parametrize("after_tokens", [3, 12])
def test_a_request_arriving_during_decodes_waits_for_the_next_receive_point(
    interval: int, after_tokens: int
) -> None:
    a, b = _serve(interval, after_tokens)
    assert a.first_token_at is not None and b.first_token_at is not None
    # The end of each of A's steps: its prefill (token 1), then one decode per token.
    ends = list(itertools.accumulate(a.itls, initial=a.first_token_at))
    # B's prompt ran in the step that gave A its token n (1-based): that step began at ends[n - 2].
    n = ends.index(pytest.approx(b.first_token_at)) + 1
    starts = ends[n - 2], ends[n - 3]
    assert starts[0] >= b.arrival  # taken in at the start of a step, once it had arrived
    # Receive points: the start of every decode step whose count since A's prefill is a multiple of
    # the interval (A's prefill step takes requests in at once after it, as any prefill does).
    assert (n - 2) % interval == 0, (n, interval)
    # ... and the first such point after B arrived: the one before came too early.
    previous = ends[n - 2 - interval] if n - 2 - interval >= 0 else -1.0
    assert previous < b.arrival


def test_an_idle_engine_takes_a_request_in_at_once() -> None:
    """Nothing running: no decode steps to wait for, whatever the interval."""

    async def go() -> float:
        cost = StepCost(2e-3, 1e-7, 1e-7, 0.0)
        engine = Engine(KVCache(1000), cost, VirtualClock(), block_size=BS, recv_interval=30)
        engine.start()
        try:
            first = engine.submit(list(range(64)), 3)
            while first.status != FINISHED:
                first.event.clear()
                await first.event.wait()
            await asyncio.sleep(0.01)
            r = engine.submit(list(range(2000, 2064)), 3)
            while r.status != FINISHED:
                r.event.clear()
                await r.event.wait()
            assert r.first_token_at is not None
            return r.first_token_at - r.arrival - cost.time(64, 0, 64, 64 * 65 / 2)
        finally:
            await engine.stop()

    assert asyncio.run(go()) == pytest.approx(0.0, abs=1e-9)
