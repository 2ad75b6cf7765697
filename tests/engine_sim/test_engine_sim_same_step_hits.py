"""Requests with a common prefix admitted in the same step share it, as in vLLM.

vLLM caches a prompt's full blocks when the step that computes them is scheduled (allocate_slots), so
a second request admitted later in that same step, a sibling sub-agent sent at the same moment, finds
them. The simulated engine used to cache blocks only once their step had run, so siblings that
arrived together all missed, and its hit rate fell below vLLM's whenever sub-agents fanned out.
SGLang's radix cache does insert a chunk only after its forward pass, and its dialect keeps that.
"""

from __future__ import annotations

import asyncio

import pytest
from agentsweep.engine_sim.kv_cache import KVCache
from agentsweep.engine_sim.profiles import StepCost
from agentsweep.engine_sim.radix_cache import SGLangCache
from agentsweep.engine_sim.scheduler import FINISHED, Engine, SimClock

BS = 16


async def _finish(req):  # type: ignore[no-untyped-def]
    while req.status != FINISHED:
        req.event.clear()
        await req.event.wait()
    return req


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_siblings_sent_together_hit_the_prefix_the_first_one_computes(policy: str) -> None:
    async def go():
        cache = KVCache(1000) if policy == "vllm" else SGLangCache(1000)
        engine = Engine(cache, StepCost(0.05, 1e-4, 1e-5, 0.0), SimClock(1.0), block_size=BS)
        engine.start()
        try:
            shared = list(range(40 * BS))  # the parent's context, 40 whole blocks
            prompts = [shared + [10**6 + 1000 * i + j for j in range(3 * BS + 5)] for i in range(3)]
            # Another user's long prefill (0.37 s) is running when the three siblings arrive together:
            # the next step admits all three.
            other = engine.submit(list(range(10**7, 10**7 + 200 * BS)), 2)
            await asyncio.sleep(0.05)
            requests = [engine.submit(p, 2) for p in prompts]
            done = await asyncio.gather(*(_finish(r) for r in requests))
            await _finish(other)
            return done, engine.stats
        finally:
            await engine.stop()

    (a, b, c), stats = asyncio.run(go())
    assert a.first_token_at == b.first_token_at == c.first_token_at  # prefilled in one step
    assert a.gpu_hit_tokens == 0
    if policy == "vllm":
        assert b.gpu_hit_tokens == c.gpu_hit_tokens == 40 * BS
        assert stats.prefix_hits == 80 * BS
    else:  # SGLang inserts the prefix into its tree only after the step that computed it
        assert b.gpu_hit_tokens == c.gpu_hit_tokens == 0
        assert stats.prefix_hits == 0
