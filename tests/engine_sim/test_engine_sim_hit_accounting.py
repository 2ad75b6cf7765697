"""Prefix-cache accounting under preemption: exported queries/hits count each request's first lookup.

A collect run once saw vllm:prefix_cache_queries_total at about twice vllm:prompt_tokens_total: every
re-admission of a preempted request was counted again (prompt plus generated tokens), and its hits
on its own just-freed blocks with it. vLLM keeps those lookups apart (PrefixCacheStats.preempted_*,
not exported), so on a real engine queries match prompt tokens and the hit rate is not inflated.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

MODEL = "meta-llama/Llama-3.3-70B-Instruct-FP8"


def _counters(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_total") and not s.labels.keys() - {"model_name", "engine"}:
                out[s.name] = s.value
    return out


def test_preempted_lookups_are_not_exported_as_queries_or_hits(sim):
    """16 requests, 4 distinct 100-token prompts, each growing to 19 blocks in a 64-block pool."""
    flags = [MODEL, "--speed", "1000", "--num-gpu-blocks-override", "64", "--tensor-parallel-size", "2"]

    async def go():
        async with sim(flags) as s:

            async def one(i: int):
                prompt = " ".join(f"u{i % 4}t{j}" for j in range(100))
                status, body = await s.post("/v1/completions", {"prompt": prompt, "max_tokens": 200})
                assert status == 200
                return body["usage"]

            usages = await asyncio.gather(*(one(i) for i in range(16)))
            stats = s.server.engine.stats
            return usages, _counters(await s.metrics()), stats

    usages, m, stats = asyncio.run(go())
    assert m["vllm:num_preemptions_total"] > 0, "the workload must preempt to test anything"
    assert stats.preempted_queries > 0  # re-lookups happened, and were kept apart
    prompt_tokens = sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert prompt_tokens == 16 * 100
    assert m["vllm:prompt_tokens_total"] == prompt_tokens
    # One first lookup per request: queries are exactly the prompt tokens ...
    assert m["vllm:prefix_cache_queries_total"] == prompt_tokens
    # ... and the hits exactly the cached tokens the clients were told about.
    assert m["vllm:prefix_cache_hits_total"] == cached
    assert 0 < cached < prompt_tokens
