"""vLLM caches every full block of a request, its generated tokens' too; they hold a place in the
eviction order (first to go among the request's blocks) although the replayer never sends an output
back. SGLang's dialect leaves output uncached (its insert at finish is not modelled)."""

from __future__ import annotations

import asyncio

import pytest
from agentsweep.engine_sim.kv_cache import KVCache, block_hashes
from agentsweep.engine_sim.profiles import StepCost
from agentsweep.engine_sim.radix_cache import SGLangCache
from agentsweep.engine_sim.scheduler import FINISHED, Engine, SimClock

BS = 16


@pytest.mark.parametrize(("policy", "cached"), [("vllm", 9), ("sglang", 3)])
def test_a_finished_request_leaves_its_output_blocks_cached_under_vllm(policy: str, cached: int) -> None:
    prompt = list(range(3 * BS + 8))  # 3 full blocks and half of one

    async def go():  # type: ignore[no-untyped-def]
        cache = KVCache(100) if policy == "vllm" else SGLangCache(100)
        engine = Engine(cache, StepCost(1e-4, 1e-7, 1e-7, 0.0), SimClock(100.0), block_size=BS)
        engine.start()
        try:
            req = engine.submit(prompt, 100)  # 56 + 100 tokens: 9 full blocks
            while req.status != FINISHED:
                req.event.clear()
                await req.event.wait()
            return cache
        finally:
            await engine.stop()

    cache = asyncio.run(go())
    assert cache.evictable == cached and cache.free == 100 - cached
    order = cache.evictable_blocks()
    prompt_blocks = block_hashes(prompt, BS)
    if policy == "vllm":
        # Tail first: the six blocks the output filled go before the prompt's three.
        assert order[-3:] == prompt_blocks[::-1] and not set(order[:6]) & set(prompt_blocks)
    # A later prompt that extends this one still hits its three prompt blocks, nothing more.
    assert cache.lookup(block_hashes(prompt + list(range(500, 600)), BS), 100).gpu_blocks == 3
