"""Cache pressure: offload hits beat recompute on TTFT, preemption under overload, many streams."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from agentsweep.engine_sim import tokenizer
from agentsweep.engine_sim.sse import WRITE_BUFFER_LIMIT
from prometheus_client.parser import text_string_to_metric_families

from .conftest import stream_text

pytestmark = pytest.mark.integration

MODEL = "meta-llama/Llama-3.3-70B-Instruct-FP8"


def _values(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.labels.get("source") or s.labels.get("transfer_type") or ""
            out[(s.name, key)] = s.value
    return out


def test_offload_hits_and_ttft_beat_recompute(sim):
    """8 prompts of 2,000 tokens (1,000 blocks) cycled 3 times over a 400-block GPU pool: LRU keeps
    nothing useful on the GPU, so without offload every prompt is recomputed; with an 8 GiB CPU tier
    (GPU + CPU hold the working set) rounds 2 and 3 hit in the CPU tier."""
    prompts = [" ".join(f"p{k}w{i}" for i in range(2000)) for k in range(8)]
    base = [MODEL, "--tensor-parallel-size", "2", "--speed", "10", "--num-gpu-blocks-override", "400"]

    async def run(flags: list[str]) -> tuple[list[float], list[int], dict]:
        async with sim([*base, *flags]) as s:
            ttfts, cached = [], []
            for _round in range(3):
                for p in prompts:
                    t0 = time.perf_counter()
                    events = await s.stream(
                        "/v1/completions",
                        {"prompt": p, "max_tokens": 1, "stream_options": {"include_usage": True}},
                    )
                    ttfts.append(time.perf_counter() - t0)
                    cached.append(s.parse(events)[1]["prompt_tokens_details"]["cached_tokens"])
            return ttfts, cached, _values(await s.metrics())

    off_ttft, off_cached, off_m = asyncio.run(run([]))
    on_ttft, on_cached, on_m = asyncio.run(run(["--kv-offloading-size", "8"]))

    assert sum(off_cached) == 0  # thrashing LRU: nothing survives a round
    assert on_cached[:8] == [0] * 8
    assert all(c == 1984 for c in on_cached[8:])  # (2000 - 1) // 16 whole blocks
    assert on_m[("vllm:external_prefix_cache_hits_total", "")] == 16 * 1984
    assert on_m[("vllm:prompt_tokens_by_source_total", "external_kv_transfer")] == 16 * 1984
    assert on_m[("vllm:kv_offload_total_bytes_total", "CPU_to_GPU")] > 0
    assert on_m[("vllm:kv_offload_total_bytes_total", "GPU_to_CPU")] > 0
    assert off_m[("vllm:kv_offload_total_bytes_total", "GPU_to_CPU")] == 0
    # Measured at the client: the CPU-tier hits cut TTFT well below recompute.
    off_p50, on_p50 = statistics.median(off_ttft[8:]), statistics.median(on_ttft[8:])
    assert on_p50 < 0.6 * off_p50, (on_p50, off_p50)


def test_preemption_under_overload(sim):
    """16 concurrent requests that each grow to 19 blocks cannot all fit in 64 blocks."""
    flags = [MODEL, "--speed", "1000", "--num-gpu-blocks-override", "64", "--tensor-parallel-size", "2"]

    async def go():
        async with sim(flags) as s:

            async def one(i: int):
                return await s.post(
                    "/v1/completions",
                    {"prompt": " ".join(f"u{i}t{j}" for j in range(100)), "max_tokens": 200},
                )

            results = await asyncio.gather(*(one(i) for i in range(16)))
            return results, _values(await s.metrics())

    results, m = asyncio.run(go())
    assert all(status == 200 for status, _ in results)
    assert all(body["usage"]["completion_tokens"] == 200 for _, body in results)
    assert m[("vllm:num_preemptions_total", "")] > 0
    assert m[("vllm:generation_tokens_total", "")] == 16 * 200
    assert m[("vllm:num_requests_running", "")] == 0 and m[("vllm:kv_cache_usage_perc", "")] == 0


def test_many_streams_each_get_every_token(sim):
    """128 concurrent streams at speed 1000 (batched decode steps) still deliver exact token counts."""

    async def go():
        async with sim([MODEL, "--speed", "1000", "--tensor-parallel-size", "2"]) as s:

            async def one(i: int):
                events = await s.stream(
                    "/v1/chat/completions",
                    {
                        "messages": [{"role": "user", "content": f"shared prefix words here {i}"}],
                        "max_tokens": 50 + i,
                        "stream_options": {"include_usage": True},
                    },
                )
                return s.parse(events)

            return await asyncio.gather(*(one(i) for i in range(128)))

    for i, (text, usage, _chunks) in enumerate(asyncio.run(go())):
        assert len(text.split()) == 50 + i
        assert usage["completion_tokens"] == 50 + i


def test_a_stream_that_is_not_read_gets_every_token_later(sim):
    """A client that stops reading holds up only its own stream, whose unsent bytes stay bounded; once
    it reads again every token arrives, in order, merged into fewer chunks."""

    async def go():
        async with sim([MODEL, "--tensor-parallel-size", "2", "--speed", "1000"]) as s:
            body = {"prompt": "a b c", "max_tokens": 120000, "stream": True}  # 2 s of wall time at least
            async with s.session.post(s.url + "/v1/completions", json=body) as resp:
                unsent = []
                for _ in range(200):  # not reading: the socket buffers fill up
                    await asyncio.sleep(0.01)
                    running = s.server.engine.running
                    if running and running[0].sink is not None:
                        stream = running[0].sink.__self__  # the SseStream pushing its chunks
                        unsent.append(stream.transport.get_write_buffer_size())
                status, _ = await s.post("/v1/completions", {"prompt": "x y z", "max_tokens": 3})
                assert status == 200  # the server went on serving others
                raw = (await resp.read()).decode()
        events = [e[len("data: ") :] for e in raw.split("\n\n")[:-1]]
        return unsent, stream_text(events)

    unsent, (text, _, chunks) = asyncio.run(go())
    # once the connection held WRITE_BUFFER_LIMIT bytes it could not send (the kernel's buffers full:
    # most runs get there), the stream wrote no more
    assert unsent and max(unsent) <= 2 * WRITE_BUFFER_LIMIT
    assert text == tokenizer.output_text(0, 120000)
    assert len(chunks) < 120000 / 2
