"""A small OpenAI-compatible streaming server for the replayer tests (run as a subprocess).

It streams ``max_tokens`` one-word chunks, then a usage chunk (prompt_tokens = words of the prompt,
cached_tokens = words shared with the same session's previous prompt, rounded down to 16), then
[DONE]; and appends one JSON line per request to --log (arrival/finish times, headers, the prompt).
Prints ``PORT <n>`` once listening.

    python stream_server.py --log FILE [--itl-ms 1] [--ttft-ms 0] [--status 200] [--bad html|usage]

``--bad html`` answers every request with an HTML page and status 200; ``--bad usage`` reports
cached_tokens far above prompt_tokens. ``--stall-after N``: the responses to the requests after the
N-th stop half-way (half of their tokens sent, then nothing, the connection held open). ``/v1/models`` gives ``--vocab-size`` (default 32000; 0: none).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

from aiohttp import web


def prompt_of(body: dict) -> str:
    if "messages" in body:
        return " ".join(m["content"] for m in body["messages"])
    prompt = body.get("prompt", "")
    return " ".join(str(i) for i in prompt) if isinstance(prompt, list) else prompt


def common_words(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def handle(request: web.Request) -> web.StreamResponse:
    args = request.app["args"]
    t_in = time.time()
    request.app["count"][0] += 1
    stall = args.stall_after is not None and request.app["count"][0] > args.stall_after
    body = await request.json()
    prompt = prompt_of(body)
    words = prompt.split()
    sid = request.headers.get("X-Session-ID", "")
    turn = request.headers.get("X-Request-ID", "").rpartition("#")[2]
    if args.fail_turns and turn in args.fail_turns.split(","):  # refused before any work: nothing cached
        return web.json_response({"error": {"message": f"turn {turn} refused"}}, status=500)
    prev = request.app["last"].get(sid, [])
    cached = common_words(prev, words) // 16 * 16
    request.app["last"][sid] = words
    if args.status != 200:
        return web.json_response({"error": {"message": "forced failure"}}, status=args.status)
    if args.bad == "html":
        return web.Response(text="<html><body>It works!</body></html>", content_type="text/html")
    if args.bad == "usage":
        cached = 10_000_000
    n = int(body.get("max_tokens") or 16)
    chat = "messages" in body
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if args.ttft_ms:
        await asyncio.sleep(args.ttft_ms / 1000)
    if chat:  # role-only first chunk, as vLLM sends: must not count as the first token
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n')
    for i in range(n):
        if stall and i == max(1, n // 2):
            await asyncio.Event().wait()  # stalled: nothing more, the connection stays open
        if i and args.itl_ms:
            await asyncio.sleep(args.itl_ms / 1000)
        delta = {"content": " tok"} if chat else None
        choice = {"index": 0, "delta": delta} if chat else {"index": 0, "text": " tok"}
        await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
    usage = {
        "prompt_tokens": len(words),
        "completion_tokens": n,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if (body.get("stream_options") or {}).get("include_usage"):
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    if args.log:
        rec = {
            "t_in": t_in,
            "t_out": time.time(),
            "path": request.path,
            "session": sid,
            "request_id": request.headers.get("X-Request-ID", ""),
            "max_tokens": body.get("max_tokens"),
            "ignore_eos": body.get("ignore_eos"),
            "words": len(words),
            "prompt": prompt if args.keep_prompts else None,
        }
        with open(args.log, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
    return resp


async def models(request: web.Request) -> web.Response:
    entry: dict = {"id": "test-model", "object": "model"}
    if request.app["args"].vocab_size:
        entry["vocab_size"] = request.app["args"].vocab_size
    return web.json_response({"object": "list", "data": [entry]})


async def main(args: argparse.Namespace) -> None:
    app = web.Application(client_max_size=1 << 28)
    app["args"] = args
    app["last"] = {}
    app["count"] = [0]  # requests so far
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_post("/v1/completions", handle)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"PORT {port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", default="")
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--status", type=int, default=200)
    ap.add_argument("--keep-prompts", action="store_true")
    ap.add_argument("--bad", choices=("html", "usage"), default=None)
    ap.add_argument("--fail-turns", default="", help="comma-separated turns answered 500 (before any work)")
    ap.add_argument("--stall-after", type=int, default=None, help="responses after the N-th stop half-way")
    ap.add_argument("--vocab-size", type=int, default=32000, help="in /v1/models; 0 leaves it out")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(ap.parse_args()))
