"""Fault modes behave as named, and the command line starts, logs and stops like a real engine."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from agentsweep.cli import main as agentsweep_main

from tests.support import WaitTimeout, wait_for_line

pytestmark = pytest.mark.integration

MODEL = "deepseek-ai/DeepSeek-R1"
BASE = [MODEL, "--tensor-parallel-size", "8", "--speed", "1000"]
BODY = {"prompt": "a b c d", "max_tokens": 20}


def test_fail_rate_and_fail_after(sim):
    async def go(flags, n):
        async with sim([*BASE, *flags]) as s:
            return [(await s.post("/v1/completions", BODY))[0] for _ in range(n)]

    assert asyncio.run(go(["--fail-rate", "1"], 3)) == [500, 500, 500]
    mixed = asyncio.run(go(["--fail-rate", "0.5", "--seed", "3"], 40))
    assert set(mixed) == {200, 500} and 8 < mixed.count(500) < 32
    assert asyncio.run(go(["--fail-rate", "0.5", "--seed", "3"], 40)) == mixed  # seeded
    assert asyncio.run(go(["--fail-after", "2"], 4)) == [200, 200, 500, 500]


def test_stall_after_stops_mid_stream(sim):
    async def go():
        async with sim([*BASE, "--stall-after", "1"]) as s:
            first = await s.stream("/v1/completions", BODY)
            assert first[-1] == "[DONE]"
            got = b""
            async with s.session.post(s.url + "/v1/completions", json={**BODY, "stream": True}) as resp:
                assert resp.status == 200
                with pytest.raises(asyncio.TimeoutError):
                    async with asyncio.timeout(1.0):
                        async for chunk in resp.content.iter_any():
                            got += chunk
            return got.decode()

    partial = asyncio.run(go())
    assert "[DONE]" not in partial
    words = sum(
        len(line.split('"text":"')[1].split('"')[0].split())
        for line in partial.split("\n\n")
        if '"text"' in line
    )
    assert words == 10  # half of max_tokens, then nothing


def test_slow_start_health_503_until_ready(sim):
    async def go():
        async with sim([*BASE, "--slow-start", "0.6"]) as s:
            async with s.session.get(s.url + "/health") as resp:
                early = resp.status
            status, _ = await s.post("/v1/completions", BODY)
            await asyncio.sleep(0.8)
            async with s.session.get(s.url + "/health") as resp:
                late = resp.status
            return early, status, late, (await s.post("/v1/completions", BODY))[0]

    assert asyncio.run(go()) == (503, 503, 200, 200)


def test_crash_after_hook_is_called(sim):
    async def go():
        async with sim([*BASE, "--crash-after", "1"]) as s:
            await s.post("/v1/completions", BODY)
            assert s.crashes == []
            await s.post("/v1/completions", BODY)
            return s.crashes

    assert asyncio.run(go()) == [1]


def _start(args: list[str]) -> tuple[subprocess.Popen[str], int, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", "engine-sim", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    try:
        started = wait_for_line(
            proc.stdout, r"Uvicorn running on http://127\.0\.0\.1:(\d+)", timeout=20, what="the startup line"
        )
    except WaitTimeout:
        proc.kill()
        raise
    return proc, int(started.match.group(1)), started.lines


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_cli_subprocess_startup_lines_and_sigterm():
    proc, port, lines = _start([*BASE, "--num-gpu-blocks-override", "1000", "--block-size", "32"])
    try:
        text = "".join(lines)
        assert "GPU KV cache size: 32,000 tokens" in text
        assert "Maximum concurrency for 163,840 tokens per request: 0.20x" in text
        assert _get(f"http://127.0.0.1:{port}/health") == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_crash_after_exits_the_process():
    proc, port, _ = _start([*BASE, "--crash-after", "1"])
    try:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=b'{"prompt": "a b", "max_tokens": 2}',
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(req, timeout=5)
        assert proc.wait(timeout=10) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([MODEL, "--speed", "0"], "--speed"),
        (["meta-llama/Llama-3.3-70B-Instruct", "--tensor-parallel-size", "1"], "no KV cache room"),
        ([MODEL, "--tensor-parallel-size", "8", "--fail-rate", "2"], "--fail-rate"),
        (["--tensor-parallel-size", "8"], "MODEL is required"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args, needle, capsys):
    assert agentsweep_main(["engine-sim", *args, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_sglang_flush_cache_and_health_generate(sim):
    async def go():
        async with sim([*BASE, "--dialect", "sglang"]) as s:
            prompt = {"prompt": " ".join(f"f{i}" for i in range(64)), "max_tokens": 1}
            await s.post("/v1/completions", prompt)
            _, body = await s.post("/v1/completions", prompt)
            before = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            async with s.session.post(s.url + "/flush_cache") as resp:
                assert resp.status == 200
            _, body = await s.post("/v1/completions", prompt)
            async with s.session.get(s.url + "/health_generate") as resp:
                assert resp.status == 200
            return before, body["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert asyncio.run(go()) == (48, 0)


@pytest.mark.parametrize(
    ("dialect", "path", "refused"),
    [
        ("vllm", "/reset_prefix_cache", 409),
        ("sglang", "/flush_cache", 400),
        ("sglang", "/reset_prefix_cache", 400),
    ],
)
def test_a_prefix_cache_reset_is_refused_while_a_request_holds_blocks(sim, dialect, path, refused):
    """As vLLM and SGLang: a reset then would leave the running request's blocks cached."""

    async def go():
        async with sim([*BASE, "--speed", "1", "--dialect", dialect]) as s:
            body = {"prompt": " ".join(f"r{i}" for i in range(100)), "max_tokens": 40, "stream": True}
            async with s.session.post(s.url + "/v1/completions", json=body) as resp:
                await resp.content.readline()
                async with s.session.post(s.url + path) as busy:
                    during = busy.status
                await resp.read()
            for _ in range(100):
                if s.server.engine.num_running == 0:
                    break
                await asyncio.sleep(0.05)
            async with s.session.post(s.url + path) as idle:
                return during, idle.status

    assert asyncio.run(go()) == (refused, 200)


def test_client_disconnect_frees_blocks(sim):
    async def go():
        async with sim([*BASE, "--speed", "1"]) as s:
            body = {"prompt": " ".join(f"d{i}" for i in range(100)), "max_tokens": 5000, "stream": True}
            async with s.session.post(s.url + "/v1/completions", json=body) as resp:
                await resp.content.readline()
            for _ in range(100):
                await asyncio.sleep(0.05)
                if s.server.engine.num_running == 0:
                    break
            return (
                s.server.engine.num_running,
                s.server.engine.kv.used,
                s.server.engine.stats.requests_finished,
            )

    running, used, finished = asyncio.run(go())
    assert running == 0 and used == 0 and finished["abort"] == 1
