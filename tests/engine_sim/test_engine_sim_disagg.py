"""Prefill and decode roles (``disagg.py``) driven directly over HTTP, both protocols, in one event loop."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from agentsweep.cell.placement import free_port
from agentsweep.engine_sim import cli
from agentsweep.errors import InputError
from agentsweep.metrics.dialects import map_text

from .conftest import parse_args

pytestmark = pytest.mark.integration

MODEL = "meta-llama/Llama-3.3-70B-Instruct"
BASE = [MODEL, "--speed", "50", "--quantization", "fp8"]
PROMPT = "the quick brown fox jumps over the lazy dog " * 40  # several hundred tokens, many blocks


def synchronous(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test body in a fresh event loop (pytest sees the fixtures through ``wraps``)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def prefill_flags(*extra: str) -> list[str]:
    return [*BASE, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0", *extra]


def decode_flags(*extra: str) -> list[str]:
    return [*BASE, "--disaggregation-mode", "decode", *extra]


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


async def vllm_handoff(p, d, body: dict, request_id: str = "r1") -> tuple[int, dict, dict]:
    """What vllm-router does: prefill with max_tokens 1, then the decode with the prefill's params."""
    pre = {
        **body,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }
    async with p.session.post(
        p.url + "/v1/completions", json=pre, headers={"X-Request-ID": request_id}
    ) as resp:
        assert resp.status == 200, await resp.text()
        first = await resp.json()
    params = first["kv_transfer_params"]
    async with d.session.post(d.url + "/v1/completions", json={**body, "kv_transfer_params": params}) as resp:
        return resp.status, await resp.json(), first


def sglang_body(body: dict, p, room: int) -> dict:
    host, _ = host_port(p.url)
    port = p.server.disagg.bootstrap_port
    return {**body, "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}


def checks(text: str, dialect: str) -> dict:
    _, row = map_text(text, dialect)
    return row


@synchronous
async def test_vllm_protocol_transfers_the_prompt_and_reports_it_cached(sim):
    async with sim(prefill_flags()) as p, sim(decode_flags()) as d:
        body = {"prompt": PROMPT, "max_tokens": 7}
        status, out, first = await vllm_handoff(p, d, body)
        assert status == 200, out
        params = first["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
        assert (params["remote_host"], params["remote_port"]) == host_port(p.url)
        assert first["usage"]["completion_tokens"] == 1
        n = out["usage"]["prompt_tokens"]
        assert out["usage"]["completion_tokens"] == 7
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == n  # the decode computed none
        # the decode released the prefill's pinned blocks once they were resident
        for _ in range(100):
            if not p.server.engine.pinned_blocks:
                break
            await asyncio.sleep(0.01)
        assert p.server.engine.pinned_blocks == 0 and not p.server.disagg.handoffs
        row = checks(await d.metrics(), "vllm")
        assert row["prompt_tokens_total"] == n
        assert row["prefix_cache_hits_total"] + row["cpu_cache_hits_total"] == n
        assert row["requests_finished_total"] == 1
        text = await d.metrics()
        assert "vllm:nixl_xfer_time_seconds_count" in text and "engine_sim:kv_transfer_tokens_total" in text


@synchronous
async def test_second_turn_hits_both_caches_and_transfers_only_the_rest(sim):
    async with sim(prefill_flags()) as p, sim(decode_flags()) as d:
        await vllm_handoff(p, d, {"prompt": PROMPT, "max_tokens": 3}, "a")
        status, out, first = await vllm_handoff(
            p, d, {"prompt": PROMPT + "and then more", "max_tokens": 3}, "b"
        )
        assert status == 200
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # prefill's prefix cache
        prow = checks(await p.metrics(), "vllm")
        assert prow["prefix_cache_hits_total"] == first["usage"]["prompt_tokens_details"]["cached_tokens"]
        drow = checks(await d.metrics(), "vllm")
        st = d.server.engine.stats
        n1 = st.prompt_tokens - out["usage"]["prompt_tokens"]
        # the decode kept the first turn's blocks: the second transfer moved only the new tail
        assert drow["prefix_cache_hits_total"] > 0
        assert st.kv_transfer_tokens == n1 + out["usage"]["prompt_tokens"] - drow["prefix_cache_hits_total"]
        assert drow["prefix_cache_hits_total"] + drow["cpu_cache_hits_total"] == st.prompt_tokens


@synchronous
@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
async def test_sglang_protocol_concurrent_rendezvous(sim, dialect):
    flags = ("--dialect", dialect)
    async with sim(prefill_flags(*flags)) as p, sim(decode_flags(*flags)) as d:
        body = sglang_body({"prompt": PROMPT, "max_tokens": 5}, p, random.getrandbits(63))
        # the decode is sent first: it must wait on the bootstrap port for the prefill to finish
        dec = asyncio.create_task(
            d.stream("/v1/completions", {**body, "stream_options": {"include_usage": True}})
        )
        await asyncio.sleep(0.05)
        status, pre = await p.post("/v1/completions", body)
        assert status == 200 and pre["usage"]["completion_tokens"] == 1
        _text, usage, _ = d.parse(await dec)
        assert usage["completion_tokens"] == 5
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"]
        row = checks(await d.metrics(), dialect)
        assert row["prefix_cache_hits_total"] + row["cpu_cache_hits_total"] == usage["prompt_tokens"]
        assert row["prompt_tokens_total"] == usage["prompt_tokens"]
        assert row["requests_finished_total"] == 1


@synchronous
async def test_chat_over_the_sglang_protocol(sim):
    async with sim(prefill_flags("--dialect", "sglang")) as p, sim(decode_flags("--dialect", "sglang")) as d:
        body = sglang_body({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}, p, 7)
        pre, dec = await asyncio.gather(
            p.post("/v1/chat/completions", body), d.post("/v1/chat/completions", body)
        )
        assert pre[0] == 200 and dec[0] == 200, dec
        assert dec[1]["usage"]["completion_tokens"] == 4
        assert dec[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == dec[1]["usage"]["prompt_tokens"]


@synchronous
async def test_decode_timeline_counts_the_prefill_and_the_transfer(sim):
    async with sim(prefill_flags()) as p, sim(decode_flags()) as d:
        status, out, first = await vllm_handoff(p, d, {"prompt": PROMPT, "max_tokens": 6})
        assert status == 200
        pre, dec = first["sim_timeline"], out["sim_timeline"]
        assert pre["prefill_s"] == 0.0 and pre["output_tokens"] == 1 and pre["ttft_s"] > 0
        # the decode's request waited for the prefill's time for the prompt, then for the transfer
        assert dec["prefill_s"] == pre["ttft_s"]
        assert dec["transfer_s"] == d.server.engine.stats.kv_transfer_time.sum > 0
        assert dec["first_token_s"] - dec["arrival_s"] >= dec["transfer_s"]
        assert dec["ttft_s"] == pytest.approx(dec["prefill_s"] + dec["first_token_s"] - dec["arrival_s"])
        assert dec["e2e_s"] == pytest.approx(dec["prefill_s"] + dec["finish_s"] - dec["arrival_s"])
        assert dec["output_tokens"] == 6 and dec["itl_s"]["n"] == 5


async def transfer_seconds(sim, gbs: str) -> float:
    async with sim(prefill_flags()) as p, sim(decode_flags("--kv-transfer-gbs", gbs)) as d:
        status, _, _ = await vllm_handoff(p, d, {"prompt": PROMPT * 4, "max_tokens": 2})
        assert status == 200
        return d.server.engine.stats.kv_transfer_time.sum


@synchronous
async def test_transfer_time_grows_as_bandwidth_falls(sim):
    fast = await transfer_seconds(sim, "450")
    slow = await transfer_seconds(sim, "5")
    # ~1.5k tokens x 327,680 B = ~0.5 GB: ~1 ms at 450 GB/s, ~100 ms at 5 GB/s (+5 ms each)
    assert slow > 10 * fast
    assert 0.005 < fast < 0.01


@synchronous
async def test_unclaimed_prefill_blocks_are_pinned_then_freed_after_the_timeout(sim):
    async with sim(prefill_flags("--kv-transfer-timeout", "10")) as p:  # 10 s simulated = 0.2 s wall
        pre = {"prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        status, _ = await p.post("/v1/completions", pre)
        assert status == 200
        engine = p.server.engine
        assert engine.pinned_blocks > 0
        used = engine.kv.used
        assert used >= engine.pinned_blocks  # pinned blocks are in use, not evictable
        await asyncio.sleep(0.4)
        assert engine.pinned_blocks == 0 and engine.stats.kv_transfer_expired == 1
        assert "vllm:nixl_num_kv_expired_reqs_total" in await p.metrics()


@synchronous
async def test_unreachable_prefill_fails_the_request(sim):
    async with sim(decode_flags()) as d:
        params = {
            "do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": free_port(),
            "remote_request_id": "x",
        }  # fmt: skip
        status, out = await d.post(
            "/v1/completions", {"prompt": "hi", "max_tokens": 2, "kv_transfer_params": params}
        )
        assert status == 502
        assert "cannot be reached" in out["error"]["message"]
        assert d.server.engine.stats.kv_transfer_failed == 1
        row = checks(await d.metrics(), "vllm")
        assert row["requests_finished_total"] == 0


@synchronous
async def test_room_never_ready_times_out(sim):
    async with sim(prefill_flags()) as p, sim(decode_flags("--kv-transfer-timeout", "20")) as d:
        body = sglang_body({"prompt": "hi there", "max_tokens": 2}, p, 12345)
        t0 = asyncio.get_running_loop().time()
        status, out = await d.post("/v1/completions", body)  # no prefill request ever comes
        assert status == 504
        assert "did not become ready" in out["error"]["message"]
        assert asyncio.get_running_loop().time() - t0 < 5
        assert not p.server.disagg.handoffs  # the waiting placeholder is gone


@synchronous
async def test_failed_prefill_fails_its_waiting_decode(sim):
    async with sim(prefill_flags("--fail-after", "0")) as p, sim(decode_flags()) as d:
        body = sglang_body({"prompt": "hi there", "max_tokens": 2}, p, 99)
        dec = asyncio.create_task(d.post("/v1/completions", body))
        await asyncio.sleep(0.05)
        status, _ = await p.post("/v1/completions", body)
        assert status == 500
        status, out = await dec
        assert status in (502, 504), out  # never a hang


@synchronous
@pytest.mark.parametrize(
    ("role", "params", "words"),
    [
        ("decode", {"do_remote_decode": True}, "asks for a prefill"),
        ("prefill", {"do_remote_prefill": True, "remote_host": "h", "remote_port": 1}, "asks for a decode"),
        ("null", {"do_remote_decode": True}, "without --disaggregation-mode"),
    ],
)
async def test_protocol_sent_to_the_wrong_role_is_a_400(sim, role, params, words):
    flags = {"decode": decode_flags(), "prefill": prefill_flags(), "null": BASE}[role]
    async with sim(flags) as s:
        status, out = await s.post(
            "/v1/completions", {"prompt": "hi", "max_tokens": 2, "kv_transfer_params": params}
        )
        assert status == 400
        assert words in out["error"]["message"]


@synchronous
async def test_null_role_rejects_a_bootstrap_room(sim):
    async with sim(BASE) as s:
        body = {
            "prompt": "hi",
            "max_tokens": 2,
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": 1,
            "bootstrap_room": 3,
        }
        status, out = await s.post("/v1/completions", body)
        assert status == 400 and "bootstrap_room" in out["error"]["message"]


@synchronous
async def test_prefill_really_listens_on_its_bootstrap_port(sim):
    async with sim(prefill_flags()) as p:
        port = p.server.disagg.bootstrap_port
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await writer.wait_closed()


@pytest.mark.parametrize(
    "flags",
    [
        ["--kv-transfer-gbs", "0"],
        ["--kv-transfer-gbs", "nan"],
        ["--kv-transfer-latency-ms", "-1"],
        ["--kv-transfer-timeout", "0"],
        ["--disaggregation-bootstrap-port", "70000"],
    ],
)
def test_bad_transfer_flags(flags):
    with pytest.raises(InputError, match=flags[0]):
        cli.resolve(parse_args([*BASE, *flags]))


def test_startup_log_names_the_role_and_bandwidth(sim):
    args = parse_args(decode_flags("--tp", "2", "--kv-transfer-gbs", "100"))
    server = cli.build_server(args, cli.resolve(args))
    line = server.disagg.describe(327680, 2)
    assert "decode role" in line and "100 GB/s per GPU x TP 2 = 200 GB/s" in line
