#!/usr/bin/env python3
"""Benchmark the SSE reader on one very large event: the time must grow linearly with its size.

Feeds a single ``data:`` event of each size, in reads of --read-kib, to the client's StreamTimer
(with the event bound raised above the size) and prints the time and MB/s per size. A reader that
re-joins or re-scans its whole buffer on every read shows MB/s falling as the size grows.

    python kv-cache-tester/benchmarks/bench_sse_parse.py [--sizes-mib 10,20,40] [--read-kib 256]
"""

from __future__ import annotations

import argparse
import time

from kv_cache_tester.replay.client import StreamTimer


def one(size: int, read: int) -> float:
    head = b'data: {"choices":[{"index":0,"delta":{"content":"'
    tail = b'"}}]}\n\ndata: [DONE]\n\n'
    body = head + b"x" * (size - len(head) - len(tail)) + tail
    reads = [body[i : i + read] for i in range(0, len(body), read)]
    try:
        timer = StreamTimer(0.0, max_event=2 * size)
    except TypeError:  # a reader without the bound
        timer = StreamTimer(0.0)
    t0 = time.perf_counter()
    for data in reads:
        timer.feed(data, 1.0)
    out = timer.finish()
    took = time.perf_counter() - t0
    assert out.ok and out.token_events == 1, out.error_message
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="10,20,40", help="event sizes in MiB")
    ap.add_argument("--read-kib", type=int, default=256, help="bytes per network read, KiB")
    args = ap.parse_args()
    print(f"{'event_mib':>9} | {'seconds':>8} | {'mb_per_s':>8}")
    for mib in (int(x) for x in args.sizes_mib.split(",")):
        took = min(one(mib << 20, args.read_kib << 10) for _ in range(3))
        print(f"{mib:>9} | {took:>8.3f} | {mib * 1.048576 / took:>8.0f}")


if __name__ == "__main__":
    main()
