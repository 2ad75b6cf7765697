#!/usr/bin/env python3
"""The replayer's memory against its stated bound (docs/replayer.md, "Memory"); prints the figures.

Each scenario writes ``--users`` traces whose prompts grow to ``--tokens`` tokens (three turns:
a third, two thirds, all of it; one sub-agent of half that size with --subagents), plus one trace
whose last request is far beyond every limit (2**31 - 1 tokens), runs ``kv-cache-tester replay
--max-context 0`` against instant_server.py for ``--duration`` seconds, samples the replayer's RSS
every 20 ms and prints: RSS after loading the traces (the replayer's own "memory:" line), its
prompt bound, the stated bound (the two plus 64 MiB), the peak RSS measured, and the bytes per
prompt token held (peak - after loading, over the tokens the lanes hold).

    python kv-cache-tester/benchmarks/bench_memory.py [--users 1,4] [--tokens 1000000,4194304] [--api chat,completions]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from kv_cache_tester.replay.memory import rss_bytes  # noqa: E402

SLACK_MIB = 64  # the fixed part of the stated bound: buffers, records, the event loop
MEMORY_LINE = re.compile(r"memory: (\d+) MiB after loading the traces; prompts held at most (\d+) MiB")


def write_traces(folder: Path, users: int, tokens: int, subagents: bool) -> int:
    """The traces; returns the prompt tokens the lanes hold at most (each owner's longest prompt)."""
    folder.mkdir(parents=True, exist_ok=True)
    block = 64
    for u in range(users):
        sizes = [tokens // 3, 2 * tokens // 3, tokens]
        reqs = [
            {"t": float(i), "in": n, "out": 4, "hash_ids": list(range(1, n // block + 1))}
            for i, n in enumerate(sizes)
        ]
        trace: dict = {"id": f"big{u}", "block_size": block, "hash_id_scope": "local", "requests": reqs}
        if subagents:
            half = tokens // 2
            trace["requests"][1]["subagents"] = [
                {"agent_id": "a0", "requests": [{"t": 1.0, "in": half, "out": 4, "hash_ids": [9_000_000]}]}
            ]
        (folder / f"big{u}.json").write_text(json.dumps(trace))
    huge = {
        "id": "huge",
        "block_size": block,
        "hash_id_scope": "local",
        "requests": [
            {"t": 0.0, "in": 1000, "out": 4, "hash_ids": [1]},
            {"t": 1.0, "in": 2**31 - 1, "out": 4, "hash_ids": [1, 2]},
        ],
    }
    (folder / "huge.json").write_text(json.dumps(huge))
    return users * (tokens + (tokens // 2 if subagents else 0))


def start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "instant_server.py"), "--port", "0", "--force-output-tokens", "4"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        raise SystemExit(f"instant server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split()[1]}"


def run(url: str, work: Path, users: int, tokens: int, api: str, duration: float) -> dict[str, float]:
    traces = work / f"traces_{users}_{tokens}"
    held = write_traces(traces, users, tokens, subagents=False)
    cmd = [
        sys.executable, "-m", "kv_cache_tester.cli", "replay", "--api-endpoint", url,
        "--trace-directory", str(traces), "--output-dir", str(work / "out"), "--max-users", str(users),
        "--max-context", "0", "--test-duration", f"{duration:g}", "--grace-period", "5", "--no-plot",
        "--no-color", "--api", api, "--model", "instant", "--progress-interval", "3600",
    ]  # fmt: skip
    log = work / "replay.log"
    t0 = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, rss_bytes(proc.pid))
            time.sleep(0.02)
    wall = time.monotonic() - t0
    text = log.read_text()
    m = MEMORY_LINE.search(text)
    if proc.returncode != 0 or m is None:
        raise SystemExit(f"replay exited {proc.returncode}:\n{text[-2000:]}")
    loaded, prompts = int(m.group(1)), int(m.group(2))
    peak_mib = peak / (1 << 20)
    return {
        "loaded_mib": loaded,
        "prompt_bound_mib": prompts,
        "bound_mib": loaded + prompts + SLACK_MIB,
        "peak_mib": peak_mib,
        "bytes_per_token": (peak_mib - loaded) * (1 << 20) / held,
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", default="1,4")
    ap.add_argument("--tokens", default="1000000,4194304")
    ap.add_argument("--api", default="chat,completions")
    ap.add_argument("--duration", type=float, default=4.0)
    args = ap.parse_args()
    server, url = start_server()
    print(
        f"{'api':<12}{'users':>6}{'tokens':>10}{'loaded MiB':>12}{'prompt MiB':>12}{'bound MiB':>11}"
        f"{'peak MiB':>10}{'B/token':>9}{'wall s':>8}  within"
    )
    ok = True
    try:
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
            for api in args.api.split(","):
                for users in map(int, args.users.split(",")):
                    for tokens in map(int, args.tokens.split(",")):
                        r = run(url, Path(tmp), users, tokens, api, args.duration)
                        within = r["peak_mib"] <= r["bound_mib"]
                        ok &= within
                        print(
                            f"{api:<12}{users:>6}{tokens:>10}{r['loaded_mib']:>12.0f}{r['prompt_bound_mib']:>12.0f}"
                            f"{r['bound_mib']:>11.0f}{r['peak_mib']:>10.0f}{r['bytes_per_token']:>9.1f}"
                            f"{r['wall_s']:>8.1f}  {'yes' if within else 'NO'}",
                            flush=True,
                        )
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
