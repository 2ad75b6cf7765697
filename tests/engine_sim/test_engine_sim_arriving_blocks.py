"""A hit on blocks still being copied back from the CPU tier waits for them to be resident.

Two users sending the same offloaded prefix at once: the first finds it in the CPU tier and pays the
transfer; the second then finds those blocks "on the GPU" although their copy is still in flight.
It used to start prefilling at once, getting its first token before the data it reused was there.
"""

from __future__ import annotations

import asyncio

from agentsweep.engine_sim.kv_cache import KVCache, block_hashes
from agentsweep.engine_sim.profiles import StepCost
from agentsweep.engine_sim.scheduler import FINISHED, Engine, SimClock

BS = 16
BLOCK_BYTES = 10**6
LINK = 10**7  # 0.1 s of simulated time per block copied back: 10 ms of wall time for the prefix, so
# the second request surely arrives while the copy is in flight


async def _finish(engine: Engine, tokens: list[int]):
    req = engine.submit(tokens, 1)
    while req.status != FINISHED:
        req.event.clear()
        await req.event.wait()
    return req


def test_second_hit_waits_for_blocks_in_flight() -> None:
    async def go():
        cache = KVCache(150, cpu_blocks=200, block_bytes=BLOCK_BYTES)
        engine = Engine(
            cache, StepCost(1e-3, 1e-6, 1e-5, 0.0), SimClock(1000.0), block_size=BS, host_link_bw=LINK
        )
        engine.start()
        try:
            prefix = list(range(100 * BS + 1))  # 100 whole blocks + 1 token
            await _finish(engine, prefix)
            await _finish(engine, list(range(10**6, 10**6 + 149 * BS + 1)))  # evicts the prefix to CPU
            hit = cache.lookup(block_hashes(prefix, BS), 100)
            assert (hit.gpu_blocks, hit.cpu_blocks) == (0, 100)
            a, b = await asyncio.gather(_finish(engine, prefix), _finish(engine, prefix))
            return a, b, engine.stats
        finally:
            await engine.stop()

    a, b, stats = asyncio.run(go())
    assert a.cpu_hit_tokens == 100 * BS  # a found the prefix in the CPU tier ...
    assert b.gpu_hit_tokens == 100 * BS  # ... b found a's copy of it on the GPU
    transfer = 100 * BLOCK_BYTES / LINK
    assert a.first_token_at - a.arrival >= transfer
    # b reuses blocks that are resident only when a's copy completes.
    assert b.first_token_at >= a.ready_at
    assert stats.prefix_hits == 100 * BS and stats.external_hits == 100 * BS
