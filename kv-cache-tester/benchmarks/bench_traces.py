#!/usr/bin/env python3
"""Trace library benchmark: load time, synthesis cost per 1k tokens, peak RSS.

    python kv-cache-tester/benchmarks/bench_traces.py [--traces DIR] [--modes words,ids]

Peak RSS is reported after loading every trace with its statistics (the 200 MB budget), then after
synthesis (one play per trace, every request in timeline order, as the replayer does).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kv_cache_tester.traces import PromptSynthesizer, load_traces  # noqa: E402
from kv_cache_tester.traces.analysis import corpus_stats, request_hits  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--traces", type=Path, default=HERE.parent / "sample_traces")
    parser.add_argument("--modes", default="words,ids")
    parser.add_argument("--repeat", type=int, default=3, help="load timings: best of N")
    args = parser.parse_args()

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, traces {args.traces}")
    print(f"peak RSS at start: {peak_rss_mb():.1f} MB")
    files = sorted(args.traces.glob("*.json"))
    biggest = max(files, key=lambda p: p.stat().st_size)
    best = min(_timed(lambda: load_traces(biggest)) for _ in range(args.repeat))
    print(f"load {biggest.name} ({biggest.stat().st_size / 1e6:.1f} MB): {best * 1e3:.0f} ms")
    best_all = min(_timed(lambda: load_traces(args.traces)) for _ in range(args.repeat))
    total_bytes = sum(p.stat().st_size for p in files)
    print(f"load all {len(files)} traces ({total_bytes / 1e6:.1f} MB): {best_all * 1e3:.0f} ms")

    result = load_traces(args.traces)
    t0 = time.perf_counter()
    corpus_stats(result.traces)
    hits = request_hits(result.traces)
    print(
        f"stats + infinite-cache hits for {len(hits)} requests: {(time.perf_counter() - t0) * 1e3:.0f} ms; "
        f"peak RSS after load + stats: {peak_rss_mb():.1f} MB"
    )

    for mode in args.modes.split(","):
        synth = PromptSynthesizer(mode, seed=0)  # type: ignore[arg-type]
        tokens = 0
        t0 = time.perf_counter()
        for trace in result.traces:
            play = synth.start_play(trace, "bench")
            for _, agent, req in trace.timeline():
                play.prompt(req, agent)
                tokens += req.in_tokens
        warm = time.perf_counter() - t0
        # cold: a fresh play for one long prompt (no memo), the cost of a lane's first request
        trace = max(result.traces, key=lambda t: max(r.in_tokens for r in t.requests))
        req = max(trace.requests, key=lambda r: r.in_tokens)
        t0 = time.perf_counter()
        synth.start_play(trace, "cold").prompt(req)
        cold = time.perf_counter() - t0
        print(
            f"synthesis {mode:5s}: {tokens / 1e6:.1f}M prompt tokens in {warm:.2f} s = "
            f"{warm / tokens * 1e9:.1f} us per 1k tokens (memoized replay); "
            f"cold {req.in_tokens} tokens: {cold / req.in_tokens * 1e9:.0f} us per 1k tokens"
        )
    print(f"peak RSS after synthesis: {peak_rss_mb():.1f} MB")
    return 0


def _timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
