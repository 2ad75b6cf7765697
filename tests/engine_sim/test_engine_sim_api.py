"""HTTP shape (vLLM-like JSON and SSE), exact cached_tokens, tokenizer template, both metric dialects."""

from __future__ import annotations

import asyncio
import random

import pytest
from agentsweep.engine_sim import tokenizer
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

MODEL = "meta-llama/Llama-3.3-70B-Instruct-FP8"
BASE = [MODEL, "--tensor-parallel-size", "2", "--speed", "1000"]


def test_chat_stream_shape_like_vllm(sim):
    async def go():
        async with sim(BASE) as s:
            body = {
                "model": MODEL,
                "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a b c"}],
                "max_tokens": 7,
                "stream_options": {"include_usage": True},
            }
            events = await s.stream("/v1/chat/completions", body)
            text, usage, chunks = s.parse(events)
            assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
            assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
            content = [c for c in chunks if c["choices"]]
            assert [c["choices"][0]["finish_reason"] for c in content][-1] == "length"
            assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
            assert chunks[-1]["choices"] == []
            assert len(text.split()) == 7
            # 5 words + 3 template tokens per message (2 messages) + 2 for the generation prompt
            assert usage == {
                "prompt_tokens": 5 + 3 * 2 + 2,
                "completion_tokens": 7,
                "total_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            # Without include_usage there is no usage chunk.
            events = await s.stream("/v1/chat/completions", {**body, "stream_options": None})
            _, usage, chunks = s.parse(events)
            assert usage is None and all(c["choices"] for c in chunks)

    asyncio.run(go())


def test_completions_stream_token_ids_and_non_stream(sim):
    async def go():
        async with sim(BASE) as s:
            ids = list(range(5000, 5040))
            events = await s.stream(
                "/v1/completions",
                {"prompt": ids, "max_tokens": 4, "stream_options": {"include_usage": True}},
            )
            text, usage, chunks = s.parse(events)
            assert chunks[0]["object"] == "text_completion" and chunks[0]["id"].startswith("cmpl-")
            assert len(text.split()) == 4 and usage["prompt_tokens"] == 40
            status, body = await s.post("/v1/completions", {"prompt": ids, "max_tokens": 3})
            assert status == 200 and body["object"] == "text_completion"
            assert body["usage"]["completion_tokens"] == 3
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 32  # two whole blocks
            assert body["choices"][0]["finish_reason"] == "length"
            status, body = await s.post(
                "/v1/chat/completions", {"messages": [{"role": "user", "content": "x y"}], "max_tokens": 2}
            )
            assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"
            # Bad input gets a vLLM-style error object.
            status, body = await s.post("/v1/completions", {"prompt": 5})
            assert status == 400 and body["error"]["code"] == 400
            status, body = await s.post("/v1/completions", {"prompt": "a", "model": "other"})
            assert status == 404
            status, body = await s.post("/v1/completions", {"prompt": "a", "max_tokens": 200_000})
            assert status == 400 and "maximum context length" in body["error"]["message"]
            status, body = await s.post("/tokenize", {"prompt": "a b c"})
            assert body["count"] == 3 and body["tokens"] == tokenizer.encode("a b c")
            async with s.session.get(s.url + "/v1/models") as resp:
                assert (await resp.json())["data"][0]["id"] == MODEL

    asyncio.run(go())


def _reference_cached(prompts: list[list[str]], block: int) -> list[int]:
    """cached tokens each prompt should see when every earlier prompt's blocks are still resident."""
    out = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            n = 0
            for a, b in zip(p, q, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        out.append(min(best // block, (len(p) - 1) // block) * block)
    return out


def test_cached_tokens_exact_against_reference(sim):
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(50)]
    prompts: list[list[str]] = []
    for _ in range(40):
        if prompts and rng.random() < 0.7:
            base = rng.choice(prompts)
            cut = rng.randrange(len(base) + 1)
            p = base[:cut] + [rng.choice(vocab) for _ in range(rng.randrange(1, 60))]
        else:
            p = [rng.choice(vocab) for _ in range(rng.randrange(1, 120))]
        prompts.append(p)
    expected = _reference_cached(prompts, 16)

    async def go():
        async with sim(BASE) as s:
            got = []
            for p in prompts:
                status, body = await s.post("/v1/completions", {"prompt": " ".join(p), "max_tokens": 2})
                assert status == 200
                assert body["usage"]["prompt_tokens"] == len(p)
                got.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
            return got, await s.metrics()

    got, metrics = asyncio.run(go())
    assert got == expected
    assert sum(expected) > 0
    fams = {f.name: f for f in text_string_to_metric_families(metrics)}
    hits = fams["vllm:prefix_cache_hits"].samples[0].value
    assert hits == sum(expected)
    assert fams["vllm:prompt_tokens"].samples[0].value == sum(len(p) for p in prompts)


def test_chat_prefix_property_gives_hits(sim):
    turn1 = [
        {"role": "system", "content": " ".join(f"s{i}" for i in range(40))},
        {"role": "user", "content": "q1"},
    ]
    reply = {"role": "assistant", "content": "r1 r2 r3"}
    turn2 = [*turn1, reply, {"role": "user", "content": "q2 " * 30}]
    t1, t2 = tokenizer.render_chat(turn1), tokenizer.render_chat(turn2)
    assert t2[: len(t1)] == t1  # the generation marker equals the reply's role + separator
    assert t2[: len(t1) - 2] == tokenizer.render_chat(turn1, add_generation_prompt=False)

    async def go():
        async with sim(BASE) as s:
            await s.post("/v1/chat/completions", {"messages": turn1, "max_tokens": 1})
            _, body = await s.post("/v1/chat/completions", {"messages": turn2, "max_tokens": 1})
            return body["usage"]

    usage = asyncio.run(go())
    assert usage["prompt_tokens"] == len(t2)
    assert usage["prompt_tokens_details"]["cached_tokens"] == (len(t1) // 16) * 16


def test_no_prefix_caching_gives_zero_hits(sim):
    async def go():
        async with sim([*BASE, "--no-enable-prefix-caching"]) as s:
            prompt = " ".join(f"x{i}" for i in range(200))
            cached = []
            for _ in range(3):
                _, body = await s.post("/v1/completions", {"prompt": prompt, "max_tokens": 2})
                cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
            return cached, await s.metrics()

    cached, metrics = asyncio.run(go())
    assert cached == [0, 0, 0]
    fams = {f.name: f for f in text_string_to_metric_families(metrics)}
    assert fams["vllm:prefix_cache_hits"].samples[0].value == 0
    assert fams["vllm:prompt_tokens"].samples[0].value == 600


VLLM_NAMES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prompt_tokens_by_source_total",
    "vllm:prompt_tokens_cached_by_source_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:kv_offload_total_bytes_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
}
SGLANG_NAMES = {
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:cached_tokens_total",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:num_retracted_reqs",
    "sglang:hicache_host_used_tokens",
    "sglang:hicache_host_total_tokens",
}


def _samples(text: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_metrics_dialects_parse_and_carry_names(sim):
    prompt = " ".join(f"m{i}" for i in range(100))

    async def go(flags):
        async with sim([*BASE, *flags]) as s:
            for _ in range(2):
                await s.post("/v1/completions", {"prompt": prompt, "max_tokens": 3})
            return await s.metrics()

    vllm = _samples(asyncio.run(go([])))
    names = {s.name for s in vllm}
    assert names >= VLLM_NAMES
    for s in vllm:
        if s.name.startswith("vllm:"):
            assert s.labels["model_name"] == MODEL and s.labels["engine"] == "0", s
    by = {(s.name, s.labels.get("source") or s.labels.get("transfer_type")): s.value for s in vllm}
    assert by[("vllm:prompt_tokens_by_source_total", "local_cache_hit")] == 96
    assert by[("vllm:prompt_tokens_by_source_total", "local_compute")] == 200 - 96
    assert by[("vllm:generation_tokens_total", None)] == 6

    sgl = _samples(
        asyncio.run(go(["--dialect", "sglang", "--enable-hierarchical-cache", "--hicache-size", "1"]))
    )
    names = {s.name for s in sgl}
    assert names >= SGLANG_NAMES
    assert not any(n.startswith("vllm:") for n in names)
    for s in sgl:
        if s.name.startswith("sglang:"):
            assert s.labels["model_name"] == MODEL and "engine" not in s.labels
    by = {(s.name, s.labels.get("cache_source")): s.value for s in sgl}
    assert by[("sglang:cached_tokens_total", "device")] == 96
    assert by[("sglang:hicache_host_total_tokens", None)] > 0


def test_model_names_are_answered_as_vllm_answers_them(sim):
    """With --served-model-name, only those names are served (the model path is a 404, as vLLM answers);
    no model or an empty one goes to the first name; a name that is not a string is a 400."""

    async def go():
        async with sim([MODEL, "--served-model-name", "alias", "other", "--speed", "1000"]) as s:
            body = {"prompt": "a b", "max_tokens": 2}
            statuses = [
                (await s.post("/v1/completions", {**body, **extra}))[0]
                for extra in ({"model": "alias"}, {"model": "other"}, {}, {"model": ""})
            ]
            assert statuses == [200, 200, 200, 200]
            status, err = await s.post("/v1/completions", {**body, "model": MODEL})
            assert status == 404 and err["error"]["type"] == "NotFoundError"
            assert err["error"]["message"] == f"The model `{MODEL}` does not exist."
            status, _ = await s.post(
                "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "model": "nope"}
            )
            assert status == 404
            status, err = await s.post("/v1/completions", {**body, "model": 5})
            assert status == 400 and "'model' must be a string" in err["error"]["message"]

    asyncio.run(go())
