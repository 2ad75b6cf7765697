#!/usr/bin/env python3
"""An OpenAI-compatible streaming server that does no work, to measure the replayer itself.

Every chat/completions request gets ``max_tokens`` (or --force-output-tokens) SSE chunks of one
token, written one by one (--itl-ms apart), a usage chunk when asked for, then [DONE]. On SIGTERM
it writes one JSON line per request to --record: X-Request-ID, server-side TTFT (whole body read ->
first token chunk written), total time and the body's size, so client TTFT minus server TTFT is the
client's own overhead. Prints ``PORT <n>`` once listening (--port 0 picks a free port).

    python instant_server.py --port 0 [--itl-ms 0] [--force-output-tokens 64] [--record FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time

from aiohttp import web

try:
    from orjson import loads
except ImportError:  # pragma: no cover
    from json import loads  # type: ignore[assignment]

CHAT_TOKEN = (
    b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" the"}}]}\n\n'
)
TEXT_TOKEN = b'data: {"object":"text_completion","choices":[{"index":0,"text":" the"}]}\n\n'
DONE = b"data: [DONE]\n\n"


class Instant:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.records: list[tuple[str, float, float, int]] = []

    async def generate(self, request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        raw = await request.read()
        t_body = time.perf_counter()
        if self.args.force_output_tokens:  # no need to parse the (large) body
            n = self.args.force_output_tokens
            include_usage = b'"include_usage":true' in raw
        else:
            body = loads(raw)
            n = int(body.get("max_tokens") or 16)
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        token = CHAT_TOKEN if request.path.endswith("chat/completions") else TEXT_TOKEN
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        itl = self.args.itl_ms / 1000.0
        await resp.write(token)
        ttft = time.perf_counter() - t_body
        for _ in range(n - 1):
            if itl:
                await asyncio.sleep(itl)
            await resp.write(token)
        if include_usage:
            words = len(raw) // 5  # rough: the benchmark does not check prompt_tokens
            usage = {"prompt_tokens": words, "completion_tokens": n, "total_tokens": words + n}
            await resp.write(b'data: {"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\n")
        await resp.write(DONE)
        await resp.write_eof()
        if self.args.record:
            rid = request.headers.get("X-Request-ID", "")
            self.records.append((rid, ttft, time.perf_counter() - t0, len(raw)))
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "instant", "object": "model", "vocab_size": 32000}]}
        )

    def dump(self) -> None:
        if self.args.record:
            with open(self.args.record, "w") as fh:
                for rid, ttft, total, size in self.records:
                    line = {"request_id": rid, "ttft_s": ttft, "total_s": total, "body_bytes": size}
                    fh.write(json.dumps(line) + "\n")


async def serve(args: argparse.Namespace) -> None:
    inst = Instant(args)
    app = web.Application(client_max_size=1 << 28)
    app.router.add_post("/v1/chat/completions", inst.generate)
    app.router.add_post("/v1/completions", inst.generate)
    app.router.add_get("/v1/models", inst.models)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"PORT {port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    inst.dump()
    await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--force-output-tokens", type=int, default=0)
    ap.add_argument("--record", default="")
    args = ap.parse_args()
    factory = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args))


if __name__ == "__main__":
    main()
