"""A ``vllm`` for the tests: ``vllm serve MODEL --host H --port P [vLLM flags]`` starts the simulated
engine (vLLM's dialect, the same flags) on a private port and stands in front of it on H:P. Chat
requests whose question is one of ``$STANDIN_DATA``'s GSM8K-format questions are answered from their
reference, a ``$STANDIN_RATE`` share right (``standin.answers_right``); everything else (the replay's
streams, /metrics, /health, /version) goes to the simulated engine unchanged.

So a cell with ``engine: vllm`` runs end to end here: the replay and the metrics are the simulated
engine's, the accuracy gate's score is the one the test chose.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from aiohttp import ClientSession, ClientTimeout, web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from standin import make_app

DROPPED = ("--kv-events-config",)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse(argv: list[str]) -> tuple[str, str, int, list[str]]:
    """(model, host, port, the other flags) of ``serve MODEL --host H --port P ...``."""
    if len(argv) < 2 or argv[0] != "serve":
        sys.exit("usage: vllm serve MODEL --host H --port P [flags]")
    model, rest = argv[1], argv[2:]
    host, port, other = "127.0.0.1", 8000, []
    i = 0
    while i < len(rest):
        if rest[i] in DROPPED:  # vLLM's own, the simulated engine has no such thing
            i += 2
            continue
        if rest[i] in ("--host", "--port"):
            host, port = (rest[i + 1], port) if rest[i] == "--host" else (host, int(rest[i + 1]))
            i += 2
            continue
        other.append(rest[i])
        i += 1
    return model, host, port, other


def _asks_a_question(body: bytes) -> bool:
    """A non-streaming chat request whose last message is a GSM8K-format question (the harness's)."""
    try:
        doc = json.loads(body)
        return not doc.get("stream") and "Question:" in doc["messages"][-1]["content"]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return False


async def serve(model: str, host: str, port: int, flags: list[str]) -> None:
    inner = free_port()
    engine = subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", "engine-sim", model, "--host", "127.0.0.1",
         "--port", str(inner), "--dialect", "vllm", "--hardware", "h200", *flags],
    )  # fmt: skip
    upstream = f"http://127.0.0.1:{inner}"
    answers = make_app(Path(os.environ["STANDIN_DATA"]), float(os.environ["STANDIN_RATE"]))
    session = ClientSession(timeout=ClientTimeout(total=None))
    for _ in range(600):  # healthy only once the engine behind is
        try:
            async with session.get(f"{upstream}/health") as reply:
                if reply.status == 200:
                    break
        except OSError:
            pass
        if engine.poll() is not None:
            sys.exit(f"the simulated engine exited with status {engine.returncode}")
        await asyncio.sleep(0.1)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST" and request.path == "/v1/chat/completions" and _asks_a_question(body):
            return await chat(request)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with session.request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as reply:
            out = web.StreamResponse(status=reply.status)
            for key in ("Content-Type", "Cache-Control"):
                if key in reply.headers:
                    out.headers[key] = reply.headers[key]
            await out.prepare(request)
            async for chunk in reply.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    chat = next(r for r in answers.router.routes() if r.method == "POST").handler

    app = web.Application(client_max_size=64 << 20)
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"fake vllm: {host}:{port} in front of the simulated engine on {inner}", flush=True)
    try:
        while engine.poll() is None:
            await asyncio.sleep(0.2)
    finally:
        engine.terminate()
        await session.close()


def main() -> None:
    model, host, port, flags = parse(sys.argv[1:])
    asyncio.run(serve(model, host, port, flags))


if __name__ == "__main__":
    main()
