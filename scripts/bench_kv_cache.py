#!/usr/bin/env python3
"""Cost of the simulator's KV bookkeeping per request, in the worst case: every prompt is new.

Each request looks its prompt up, takes blocks (evicting the least recently released), caches its
blocks in prefill-sized chunks and, a few requests later, lets them go: the path a thrashing pool
takes for every request (the replayer benchmark's 20k-token prompts on an H200 pool). Prints the
microseconds each operation costs per request, with and without a CPU offload tier, under each
dialect's policy (vLLM's ``KVCache``, SGLang's ``SGLangCache`` with HiCache write-through).

    .venv/bin/python scripts/bench_kv_cache.py --blocks-per-request 1250 --requests 900
"""

from __future__ import annotations

import argparse
import random
import time

from agentsweep.engine_sim.kv_cache import KVCache
from agentsweep.engine_sim.radix_cache import SGLangCache

POLICIES: dict[str, type[KVCache]] = {"vllm": KVCache, "sglang": SGLangCache}


def run(
    policy: type[KVCache],
    pool_blocks: int,
    cpu_blocks: int,
    per_request: int,
    requests: int,
    chunk: int,
    live: int,
) -> dict[str, float]:
    cache = policy(pool_blocks, cpu_blocks=cpu_blocks, block_bytes=1)
    rnd = random.Random(0)
    held = []
    spent = {"lookup+acquire": 0.0, "allocate": 0.0, "register": 0.0, "release": 0.0}
    for _ in range(requests):
        hashes = [rnd.getrandbits(62) for _ in range(per_request)]
        t0 = time.perf_counter()
        node = cache.acquire(cache.lookup(hashes, per_request))
        t1 = time.perf_counter()
        cache.allocate(per_request)
        t2 = time.perf_counter()
        for start in range(0, per_request, chunk):
            node, _ = cache.register(node, hashes[start : start + chunk])
        t3 = time.perf_counter()
        held.append(node)
        if len(held) > live:
            cache.release(held.pop(0), 0)
        t4 = time.perf_counter()
        for key, dt in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            spent[key] += dt
    return {key: dt / requests * 1e6 for key, dt in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--pool-blocks", type=int, default=534_656 // 16, help="GPU pool (default: H200 Llama-70B TP2)"
    )
    ap.add_argument("--cpu-blocks", type=int, default=100_000, help="CPU tier for the offload row")
    ap.add_argument("--blocks-per-request", type=int, default=1250, help="20k tokens in 16-token blocks")
    ap.add_argument("--requests", type=int, default=900)
    ap.add_argument("--chunk", type=int, default=512, help="blocks cached per prefill step (8192 tokens)")
    ap.add_argument("--live", type=int, default=20, help="requests running at once")
    args = ap.parse_args()
    print(f"KV bookkeeping, microseconds per request of {args.blocks_per_request} new blocks")
    for name, policy in POLICIES.items():
        for label, cpu in (("gpu only", 0), ("with cpu tier", args.cpu_blocks)):
            row = run(
                policy, args.pool_blocks, cpu, args.blocks_per_request, args.requests, args.chunk, args.live
            )
            cells = "  ".join(f"{k} {v:7.1f}" for k, v in row.items())
            print(f"  {name:6s} {label:14s} {cells}  total {sum(row.values()):7.1f}")


if __name__ == "__main__":
    main()
