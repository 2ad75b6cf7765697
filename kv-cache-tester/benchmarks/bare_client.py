#!/usr/bin/env python3
"""The floor for any Python client: a bare asyncio load generator to measure the replayer against.

Each user holds one HTTP/1.1 keep-alive connection and sends one prebuilt streaming chat request
(the replayer's body shape and size: ``--prompt-words`` one-token words, ``include_usage``) as soon
as its previous response has ended. Nothing is parsed: TTFT is the first read that holds ``data:``,
the end is the chunked body's terminator. Each request carries its own ``X-Request-ID`` so that the
instant server's per-request record gives the client's own TTFT overhead.

Writes one JSON line per finished request to ``--out`` at the end (request_id, t_dispatch, t_done,
ttft_s; seconds from the start) and prints ``DONE <requests> cpu <CPU seconds>``.

    python bare_client.py --port P --users 64 --duration 25 --out bare.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

TERMINATOR = b"0\r\n\r\n"  # the last chunk of a chunked response body


def request_body(words: int, max_tokens: int) -> bytes:
    # Two-syllable words, as in the replayer's words mode: the same body size for the same tokens.
    vowels = ["a", "e", "i", "o", "u", "ai", "au", "ea", "ee", "ei", "ia", "ie", "io", "oa", "oo", "ou"]
    syllables = [c + v for c in "bdfghjklmnprstvz" for v in vowels]
    rng = random.Random(0)
    prompt = " ".join(rng.choice(syllables) + rng.choice(syllables) for _ in range(words))
    return json.dumps(
        {
            "model": "instant",
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
        },
        separators=(",", ":"),
    ).encode()


async def user(
    index: int,
    host: str,
    port: int,
    body: bytes,
    t_end: float,
    records: list[tuple[str, float, float, float | None]],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nX-Request-ID: "
    ).encode()
    clock = time.perf_counter
    n = 0
    try:
        while True:
            t0 = clock()
            if t0 >= t_end:
                return
            rid = f"bare-{index}-{n}"
            n += 1
            writer.write(head + rid.encode() + b"\r\n\r\n" + body)
            first: float | None = None
            tail = b""
            while True:
                data = await reader.read(1 << 18)
                if not data:
                    return
                if first is None and b"data:" in data:
                    first = clock() - t0
                tail = (tail + data)[-8:]
                if tail.endswith(TERMINATOR):
                    break
            records.append((rid, t0, clock(), first))
    finally:
        writer.close()


async def run(args: argparse.Namespace) -> list[tuple[str, float, float, float | None]]:
    body = request_body(args.prompt_words, args.max_tokens)
    records: list[tuple[str, float, float, float | None]] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(user(i, args.host, args.port, body, t0 + args.duration, records) for i in range(args.users))
    )
    return [(rid, a - t0, b - t0, f) for rid, a, b, f in records]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--duration", type=float, default=25.0, help="seconds of sending (warmup included)")
    ap.add_argument("--prompt-words", type=int, default=20000)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        records = runner.run(run(args))
    with open(args.out, "w") as fh:
        for rid, t_dispatch, t_done, ttft in records:
            fh.write(
                json.dumps({"request_id": rid, "t_dispatch": t_dispatch, "t_done": t_done, "ttft_s": ttft})
            )
            fh.write("\n")
    print(f"DONE {len(records)} cpu {time.process_time():.3f}", flush=True)


if __name__ == "__main__":
    main()
