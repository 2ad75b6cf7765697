#!/usr/bin/env python3
"""Throughput of the simulated engine: requests/s and streamed tokens/s it serves with N streams.

Starts ``agentsweep engine-sim`` as a subprocess pinned to one CPU core (when the OS allows), drives
it with N concurrent streaming clients (a small aiohttp client: each stream sends requests back to
back, with a per-stream prompt that grows by one turn each time, like an agentic session, drawn
from a fixed 65,536-word vocabulary as the replayer's words mode does) for a
fixed time, and prints a table: requests/s, streamed tokens/s, SSE chunks/s, the server's CPU share
of its core and the client's CPU time. A server CPU share well below 100% means the simulator had
headroom (the client or the clock was the limit).

    .venv/bin/python scripts/bench_engine_sim.py --streams 256 --speed 1000 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiohttp

# A fixed vocabulary, as the replayer's words mode uses (65,536 words, one token each).
VOCAB = [f"w{k:x}" for k in range(65536)]


@dataclass
class Totals:
    requests: int = 0
    errors: int = 0
    tokens: int = 0
    chunks: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft: list[float] = field(default_factory=list)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], int]:
    cmd = [
        sys.executable, *(args.python_args.split() or ["-m", "agentsweep.cli"]), "engine-sim", args.model, "--port", "0",
        "--tensor-parallel-size", str(args.tp), "--hardware", args.hardware, "--speed", str(args.speed),
        *args.engine_args.split(),
    ]  # fmt: skip
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        cmd = ["taskset", "-c", str(args.cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"Uvicorn running on http://[^:]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    raise SystemExit("engine-sim did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


async def stream_worker(
    i: int, session: aiohttp.ClientSession, url: str, args: argparse.Namespace, stop: float, tot: Totals
) -> None:
    rng = random.Random(i)
    history = rng.choices(VOCAB, k=args.prompt_words)
    turn = 0
    while time.perf_counter() < stop:
        body = {
            "prompt": " ".join(history),
            "max_tokens": args.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        first = None
        try:
            async with session.post(url, json=body) as resp:
                if resp.status != 200:
                    tot.errors += 1
                    await resp.read()
                    continue
                async for line in resp.content:
                    if not line.startswith(b"data: {"):
                        continue
                    if b'"usage":{' in line:
                        u = line.split(b'"prompt_tokens":', 1)[1]
                        tot.prompt_tokens += int(u.split(b",", 1)[0])
                        tot.cached_tokens += int(line.split(b'"cached_tokens":', 1)[1].split(b"}", 1)[0])
                        continue
                    tot.chunks += 1
                    if first is None:
                        first = time.perf_counter() - t0
                    text = line.split(b'"text":"', 1)[1].split(b'"', 1)[0]
                    tot.tokens += text.count(b" ")
        except aiohttp.ClientError:
            tot.errors += 1
            continue
        tot.requests += 1
        if first is not None:
            tot.ttft.append(first)
        turn += 1
        history += rng.choices(VOCAB, k=args.turn_words)
        if len(history) > args.max_prompt_words:
            history = history[: args.prompt_words]


def _hist_mean(text: str, name: str) -> float:
    """Mean of a histogram over the whole run (warm-up included), from the exposition text."""
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(name + "_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total / count if count else float("nan")


async def drive(port: int, args: argparse.Namespace, pid: int) -> dict[str, float]:
    url = f"http://127.0.0.1:{port}/v1/completions"
    tot = Totals()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as session:
        # warm-up: one request per stream is not counted
        warm = argparse.Namespace(**{**vars(args), "max_tokens": 2})
        await asyncio.gather(
            *(stream_worker(i, session, url, warm, time.perf_counter() + 0.001, Totals()) for i in range(8))
        )
        cpu0, ccpu0 = cpu_seconds(pid), time.process_time()
        t0 = time.perf_counter()
        stop = t0 + args.duration
        await asyncio.gather(*(stream_worker(i, session, url, args, stop, tot) for i in range(args.streams)))
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(pid) - cpu0
        ccpu = time.process_time() - ccpu0
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            metrics = await resp.text()
    tot.ttft.sort()
    p50 = tot.ttft[len(tot.ttft) // 2] if tot.ttft else float("nan")
    return {
        "streams": args.streams,
        "speed": args.speed,
        "wall_s": wall,
        "requests": tot.requests,
        "errors": tot.errors,
        "requests_per_s": tot.requests / wall,
        "tokens_per_s": tot.tokens / wall,
        "chunks_per_s": tot.chunks / wall,
        "tokens_per_chunk": tot.tokens / tot.chunks if tot.chunks else 0.0,
        "prompt_tok_per_s": tot.prompt_tokens / wall,
        "hit_rate": tot.cached_tokens / tot.prompt_tokens if tot.prompt_tokens else 0.0,
        "ttft_p50_wall_ms": p50 * 1e3,
        "server_ttft_mean_sim_s": _hist_mean(metrics, "vllm:time_to_first_token_seconds"),
        "server_itl_mean_sim_s": _hist_mean(metrics, "vllm:inter_token_latency_seconds"),
        "server_cpu_share": cpu / wall,
        "requests_per_server_cpu_s": tot.requests / cpu if cpu else float("nan"),
        "tokens_per_server_cpu_s": tot.tokens / cpu if cpu else float("nan"),
        "client_cpu_share": ccpu / wall,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="meta-llama/Llama-3.3-70B-Instruct-FP8")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--hardware", default="h200")
    p.add_argument("--speed", type=float, default=1000.0)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--duration", type=float, default=20.0, help="seconds of measurement")
    p.add_argument("--prompt-words", type=int, default=2000, help="first-turn prompt length per stream")
    p.add_argument("--turn-words", type=int, default=200, help="words each turn appends")
    p.add_argument("--max-prompt-words", type=int, default=20000, help="start over past this length")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--cpu", type=int, default=0, help="pin the server to this core (taskset); -1: no pinning")
    p.add_argument("--engine-args", default="", help="extra engine-sim flags")
    p.add_argument("--python-args", default="", help="interpreter flags for the server (e.g. profiling)")
    args = p.parse_args()
    if args.cpu is not None and args.cpu < 0:
        args.cpu = None
    proc, port = start_server(args)
    try:
        try:
            import uvloop

            row = uvloop.run(drive(port, args, proc.pid))
        except ImportError:
            row = asyncio.run(drive(port, args, proc.pid))
    finally:
        proc.terminate()
        rest, _ = proc.communicate(timeout=10)
    # The server's shutdown line: how many steps were already due when computed (its CPU was the limit)
    late = re.search(
        r"Simulated clock: ([\d.]+)% of (\d+) engine steps.*?([\d.]+) ms \(wall\) late", rest or ""
    )
    if late:
        row["server_steps"] = int(late.group(2))
        row["server_steps_late_pct"] = float(late.group(1))
        row["server_late_mean_ms"] = float(late.group(3))
        row["server_steps_per_request"] = row["server_steps"] / row["requests"] if row["requests"] else 0.0
    width = max(len(k) for k in row)
    print(
        f"engine-sim benchmark ({args.model}, tp={args.tp}, {args.hardware}, {os.cpu_count()} CPUs visible)"
    )
    for key, value in row.items():
        print(f"  {key:<{width}}  {value:,.3f}" if isinstance(value, float) else f"  {key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
