"""Each response states the request's own timeline in simulated time (``sim_timeline``), and the
request log carries the same object with the client's request id."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

MODEL = "meta-llama/Llama-3.3-70B-Instruct-FP8"
SPEED = 200.0
BASE = [MODEL, "--tensor-parallel-size", "2", "--speed", str(SPEED)]
PROMPT = "alpha beta gamma delta " * 100


def check_timeline(tl: dict, output_tokens: int) -> None:
    """The fields agree with one another (docs/engine-sim.md)."""
    assert tl["arrival_s"] < tl["first_token_s"] <= tl["finish_s"]
    assert tl["ttft_s"] == pytest.approx(tl["first_token_s"] - tl["arrival_s"], rel=1e-12)
    assert tl["e2e_s"] == pytest.approx(tl["finish_s"] - tl["arrival_s"], rel=1e-12)
    assert tl["output_tokens"] == output_tokens
    assert tl["tpot_s"] == pytest.approx((tl["finish_s"] - tl["first_token_s"]) / (output_tokens - 1))
    itl = tl["itl_s"]
    assert itl["n"] == output_tokens - 1  # one gap per token after the first
    assert itl["mean"] * itl["n"] == pytest.approx(tl["finish_s"] - tl["first_token_s"])
    assert 0 < itl["p50"] <= itl["p99"] <= itl["max"]
    assert tl["prefill_s"] == 0.0 and tl["transfer_s"] == 0.0 and tl["preemptions"] == 0
    assert tl["speed"] == SPEED and abs(tl["clock_start_unix"] - time.time()) < 600


@pytest.mark.integration
def test_stream_and_body_end_with_the_timeline_that_the_histograms_count(sim, tmp_path):
    async def go():
        log = tmp_path / "requests_engine.jsonl"
        async with sim(BASE) as s:
            log_file = log.open("w")
            s.server.engine.request_log = log_file  # what --request-log sets
            body = {"prompt": PROMPT, "max_tokens": 12, "stream": True}
            t0 = time.perf_counter()
            first_at = None
            raw = b""
            async with s.session.post(
                s.url + "/v1/completions", json=body, headers={"X-Request-ID": "trace-1#0"}
            ) as resp:
                async for line in resp.content:
                    if first_at is None and b'"text":" ' in line:
                        first_at = time.perf_counter() - t0
                    raw += line
            events = [e[len("data: ") :] for e in raw.decode().split("\n\n")[:-1]]
            text, _, chunks = s.parse(events)
            stamped = [c for c in chunks if "sim_timeline" in c]
            assert stamped == [chunks[-1]] and chunks[-1]["choices"][0]["finish_reason"] == "length"
            streamed = stamped[0]["sim_timeline"]
            check_timeline(streamed, len(text.split()))
            # the engine's clock never runs ahead of the wall clock: the client saw the first token
            # no earlier than the engine produced it, scaled by the speed-up
            assert first_at * SPEED >= streamed["ttft_s"]
            st = s.server.engine.stats
            assert st.ttft.sum == streamed["ttft_s"] and st.e2e.sum == streamed["e2e_s"]
            assert st.itl.sum == pytest.approx(streamed["itl_s"]["mean"] * streamed["itl_s"]["n"])

            chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5}
            status, whole = await s.post("/v1/chat/completions", chat)
            assert status == 200
            check_timeline(whole["sim_timeline"], whole["usage"]["completion_tokens"])
            assert whole["sim_timeline"]["arrival_s"] > streamed["finish_s"]
            chat_events = await s.stream("/v1/chat/completions", chat)
            _, _, chat_chunks = s.parse(chat_events)
            assert [c for c in chat_chunks if "sim_timeline" in c] == [chat_chunks[-1]]
            s.server.engine.request_log = None
            log_file.close()
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        assert [rec.pop("request_id") for rec in lines] == ["trace-1#0", None, None]
        assert [(rec.pop("prompt_tokens"), rec.pop("cached_tokens")) for rec in lines[:2]] == [
            (400, 0),
            (405, 0),  # 400 words + 3 template tokens + 2 for the generation prompt
        ]
        assert lines[:2] == [streamed, whole["sim_timeline"]]

    asyncio.run(go())
