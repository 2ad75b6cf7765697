"""The simulated clock: step times follow the profile's formula and --speed scales wall time."""

from __future__ import annotations

import asyncio
import time

import pytest
from agentsweep.engine_sim.profiles import HARDWARE, deploy, find_model
from prometheus_client.parser import text_string_to_metric_families

MODEL = "meta-llama/Llama-3.3-70B-Instruct-FP8"


def _sum_count(text: str, name: str) -> tuple[float, float]:
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            vals = {s.name: s.value for s in fam.samples}
            return vals[name + "_sum"], vals[name + "_count"]
    raise AssertionError(name)


@pytest.mark.integration
@pytest.mark.parametrize("speed", [20.0, 200.0])
def test_single_request_timeline_matches_step_model(sim, speed):
    cost = deploy(MODEL, "h200", 2).cost
    prompt_len, out = 3000, 30
    # the prompt is one chunk: each of its tokens attends to the ones before it (and itself)
    # the request overhead (calibrated per hardware) passes before the scheduler takes the request
    ttft = cost.admit_s + cost.time(prompt_len, 0, prompt_len, prompt_len * (prompt_len + 1) / 2)
    itls = [cost.time(0, 1, prompt_len + i) for i in range(1, out)]

    async def go():
        async with sim([MODEL, "--tensor-parallel-size", "2", "--speed", str(speed)]) as s:
            t0 = time.perf_counter()
            _, body = await s.post(
                "/v1/completions", {"prompt": " ".join(["w"] * prompt_len), "max_tokens": out}
            )
            wall = time.perf_counter() - t0
            return wall, body, await s.metrics()

    wall, body, metrics = asyncio.run(go())
    assert body["usage"]["completion_tokens"] == out
    assert _sum_count(metrics, "vllm:time_to_first_token_seconds") == (pytest.approx(ttft, rel=1e-6), 1)
    itl_sum, itl_count = _sum_count(metrics, "vllm:inter_token_latency_seconds")
    assert itl_count == out - 1 and itl_sum == pytest.approx(sum(itls), rel=1e-6)
    # The wall clock: never faster than the simulated time / speed, and not much slower.
    sim_total = ttft + sum(itls)
    assert wall >= 0.98 * sim_total / speed
    assert wall <= sim_total / speed + 1.0


def test_profiles_cover_the_configs_models_and_hardware():
    assert find_model("deepseek-ai/DeepSeek-R1-0528").key == "deepseek-r1"
    assert find_model("Qwen/Qwen3.5-397B-A17B-FP8").key == "qwen3.5-397b-a17b"
    assert find_model("some-org/Mystery-13B").key == "generic-13b"
    assert {HARDWARE[h].hbm_bytes for h in ("h200", "b200", "mi355x")} == {141e9, 180e9, 288e9}
    llama = deploy(MODEL, "h200", 2)
    assert llama.kv_bytes_per_token_gpu == 80 * 2 * 4 * 128 * 2  # 8 KV heads split over 2 ranks
    r1 = deploy("deepseek-ai/DeepSeek-R1", "h200", 8)
    assert r1.kv_bytes_per_token_gpu == 61 * 576 * 2  # MLA latent, replicated per rank
    assert (
        deploy("deepseek-ai/DeepSeek-R1", "h200", 8, kv_cache_dtype="fp8").kv_bytes_per_token_gpu == 61 * 576
    )
    # More HBM and bandwidth: a larger pool and faster steps on B200 / MI355X than on H200.
    h, b, m = (deploy(MODEL, hw, 2) for hw in ("h200", "b200", "mi355x"))
    assert h.gpu_blocks(16, 0.9) < b.gpu_blocks(16, 0.9) < m.gpu_blocks(16, 0.9)
    assert b.cost.time(0, 64, 640_000) < h.cost.time(0, 64, 640_000)
    assert deploy("nvidia/DeepSeek-R1-FP4", "b200", 4).precision == "fp4"
