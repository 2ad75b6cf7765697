"""Bad `agentsweep engine-sim` flags: one line naming the flag, exit status 2, and no server started.

Before these checks, NaN/inf and negative values either crashed with a traceback (int(nan) while
sizing the CPU tier) or started a server with a meaningless setting (an infinite clock, a negative
slow start, an unknown KV dtype silently treated as bf16).
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import pytest
from agentsweep.cli import main
from agentsweep.engine_sim import cli


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--speed", "nan"], "--speed: must be > 0 and finite, got nan"),
        (["--speed", "inf"], "--speed: must be > 0 and finite, got inf"),
        (["--kv-offloading-size", "nan"], "--kv-offloading-size: must be >= 0 and finite, got nan"),
        (["--kv-offloading-size", "inf"], "--kv-offloading-size: must be >= 0 and finite, got inf"),
        (
            ["--enable-hierarchical-cache", "--hicache-ratio", "nan"],
            "--hicache-ratio: must be >= 0 and finite, got nan",
        ),
        (["--hicache-ratio", "-1"], "--hicache-ratio: must be >= 0 and finite, got -1.0"),
        (["--slow-start", "-1"], "--slow-start: must be >= 0 and finite, got -1.0"),
        (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization: must be in (0, 1], got nan"),
        (["--fail-rate", "nan"], "--fail-rate: must be in [0, 1], got nan"),
        (["--default-max-tokens", "0"], "--default-max-tokens: must be >= 1, got 0"),
        (["--max-model-len", "-5"], "--max-model-len: must be >= 1, got -5"),
        (["--max-num-seqs", "0"], "--max-num-seqs: must be >= 1, got 0"),
        (
            ["--kv-cache-dtype", "fp9"],
            "--kv-cache-dtype: expected auto, bfloat16, fp16 or fp8[_e4m3|_e5m2], got 'fp9'",
        ),
        (["--port", "70000"], "--port: must be in 0..65535, got 70000"),
        (
            ["--calibration-generation", "pre-v0.5.9"],
            "--calibration-generation: no calibration h200/bf16@pre-v0.5.9 (older generations of "
            "h200/bf16: none)",
        ),
        (
            ["--step-coefficients", "a=0.01,z=1"],
            "--step-coefficients: 'z=1' is not NAME=SECONDS with NAME one of a, a_p, b, c, d, e, m, r",
        ),
        (
            ["--step-coefficients", "b"],
            "--step-coefficients: 'b' is not NAME=SECONDS with NAME one of a, a_p, b, c, d, e, m, r",
        ),
        (["--step-coefficients", "r=-0.1"], "--step-coefficients: r='-0.1' is not seconds >= 0"),
        (["--step-coefficients", "a=nan"], "--step-coefficients: a='nan' is not seconds >= 0"),
    ],
)
def test_bad_flag_is_one_line(capsys: pytest.CaptureFixture[str], flags: list[str], expected: str) -> None:
    rc = main(["engine-sim", "meta-llama/Llama-3.3-70B-Instruct", "--port", "0", *flags])
    captured = capsys.readouterr()
    assert (rc, captured.out) == (2, "")
    assert captured.err == f"input error: engine-sim {expected}\n"


@pytest.mark.parametrize(("dtype", "kv_bytes"), [("auto", 2), ("bfloat16", 2), ("fp8", 1), ("fp8_e4m3", 1)])
def test_real_kv_cache_dtypes_are_accepted(dtype: str, kv_bytes: int) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["meta-llama/Llama-3.3-70B-Instruct", "--tp", "4", "--kv-cache-dtype", dtype])
    assert cli.resolve(args).deployment.kv_dtype_bytes == kv_bytes


@pytest.mark.integration
def test_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        rc = main(["engine-sim", "m", "--port", str(port)])
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err == (
        f"input error: engine-sim --host/--port: cannot bind 127.0.0.1:{port}: Address already in use\n"
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "stream": True, "stream_options": "x"},
            "'stream_options' must be an object",
        ),
        ("/v1/completions", {"prompt": "", "max_tokens": 2}, "The decoder prompt cannot be empty"),
        ("/v1/completions", {"prompt": [1, "a"]}, "'prompt' must be a string or a list of token ids"),
        ("/v1/completions", {"prompt": [1, 2**32]}, "'prompt' must be a string or a list of token ids"),
        ("/v1/chat/completions", {"messages": [1]}, "messages[0] must be an object"),
    ],
    ids=[
        "stream_options not an object",
        "empty prompt",
        "mixed ids",
        "id too large",
        "message not an object",
    ],
)
def test_bad_request_is_a_400_not_a_500(sim, path: str, body: dict, message: str) -> None:
    # A non-object stream_options used to raise AttributeError inside the handler (HTTP 500), after
    # the request had already been handed to the engine; an empty prompt was served.
    async def go():
        async with sim(["m", "--speed", "100"]) as s:
            status, reply = await s.post(path, body)
            ok, _ = await s.post("/v1/completions", {"prompt": "still serving", "max_tokens": 1})
            return status, reply, ok, s.server.engine.stats.prompt_tokens

    status, reply, ok, prompt_tokens = asyncio.run(go())
    assert status == 400 and reply["error"]["message"].startswith(message)
    assert ok == 200 and prompt_tokens == 2  # only the good request reached the engine


def test_step_coefficients_replace_the_profiles_and_are_stated() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    base = cli.resolve(parser.parse_args(["meta-llama/Llama-3.3-70B-Instruct", "--tp", "4"])).deployment.cost
    args = parser.parse_args(
        [
            "meta-llama/Llama-3.3-70B-Instruct",
            "--tp",
            "4",
            "--step-coefficients",
            "a=0.014, b=2.5e-4,a_p=0,r=0.17",
        ]
    )
    setup = cli.resolve(args)
    cost = setup.deployment.cost
    assert (cost.a, cost.b, cost.prefill_a, cost.admit_s) == (0.014, 2.5e-4, 0.0, 0.17)
    assert (cost.c, cost.d, cost.e) == (base.c, base.d, base.e)  # the rest stays the profile's
    assert cost.time(1000, 0, 0) == pytest.approx(0.014 + 0.25 + cost.e * 0)
    lines = "\n".join(cli.startup_lines(args, setup))
    assert "step time = 14.000 ms (+ 0.000 ms when prefilling) + 250.000 us/prefill token" in lines
    assert "each request waits 170.000 ms before the scheduler can take it" in lines
    settings = cli.settings_line(args, setup, 8000)
    assert '"step_coefficients": "a=0.014,b=0.00025,a_p=0,r=0.17"' in settings
