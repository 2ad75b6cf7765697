#!/usr/bin/env python3
"""Measure `agentsweep collect` on one cell with a large requests.jsonl: wall time and peak RSS.

    .venv/bin/python scripts/bench_collect.py --records 1000000

Writes a synthetic result directory (contract-shaped cell.json, status.txt, summary.json,
server_metrics.csv and N request records) into a temporary folder, runs the collect command in a
child process (tables only, no plots) and reports the child's time and peak resident memory.
Repeat with a different --records to see that memory does not grow with the record count.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = 1_767_225_600.0


def write_cell(root: Path, records: int) -> Path:
    cell = root / "agentic_bench-tp1-ep1-u64-on"
    cell.mkdir(parents=True)
    fields = {
        "config_key": "bench",
        "exp_name": cell.name[len("agentic_") :],
        "engine": "sim",
        "tp": 1,
        "gpus": 1,
    }
    fields |= {"users": 64, "offload": "on", "runner": "local", "model": "m", "duration": 3600, "traces": "t"}
    doc = {"schema_version": 1, "cell": fields, "versions": {}, "status": "SUCCESS", "reason": None}
    (cell / "cell.json").write_text(json.dumps(doc))
    (cell / "status.txt").write_text("SUCCESS\n")
    pct = {"mean": 1.0, "p50": 1.0, "p90": 2.0, "p95": 2.5, "p99": 3.0, "p99.9": 4.0}
    summary = {
        "schema_version": 1,
        "counts": {"sent": records, "ok": records, "failed": 0, "failed_by_class": {}, "warmup": 0},
        "window": {"start_unix": START, "end_unix": START + 3600, "duration_s": 3600},
        "throughput": {
            "requests_per_s": 1,
            "input_tok_per_s": 1,
            "output_tok_per_s": 1,
            "total_tok_per_s": 2,
        },
        "latency": {k: pct for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "interactivity_tok_per_s")},
        "cache": {"theoretical_hit_rate": 0.9},
        "validity": {"valid": True, "reasons": [], "checks": {}},
    }
    (cell / "summary.json").write_text(json.dumps(summary))
    rng = random.Random(1)
    with (cell / "requests.jsonl").open("w") as fh:
        for i in range(records):
            rec = {
                "trace_id": f"trace_{i % 997}",
                "session_id": f"trace_{i % 997}",
                "user": i % 64,
                "turn": i // 64,
                "phase": "profile",
                "t_dispatch": i * 0.0036,
                "ttft_s": rng.lognormvariate(-1, 0.8),
                "e2e_s": rng.lognormvariate(1.5, 0.5),
                "itl_s": {"p50": 0.02, "p99": 0.08},
                "tpot_s": rng.lognormvariate(-4, 0.3),
                "prompt_tokens": 30000 + i % 5000,
                "cached_tokens": 27000,
                "expected_prompt_tokens": 30000,
                "output_tokens": 300,
                "expected_output_tokens": 300,
                "theoretical_hit_blocks": 1700,
                "total_blocks": 1900,
                "status": "ok",
                "error": None,
            }
            fh.write(json.dumps(rec) + "\n")
    with (cell / "server_metrics.csv").open("w") as fh:
        fh.write("time_s,prefix_cache_queries_total,prefix_cache_hits_total,kv_cache_usage\n")
        for s in range(3700):
            fh.write(f"{START - 50 + s},{s * 1000},{s * 700},0.5\n")
    return cell


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "artifacts"
        t0 = time.monotonic()
        cell = write_cell(root, args.records)
        size_mb = (cell / "requests.jsonl").stat().st_size / 1e6
        print(f"wrote {args.records:,} records ({size_mb:,.0f} MB) in {time.monotonic() - t0:.1f} s")
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentsweep.cli",
                "collect",
                str(root),
                str(Path(tmp) / "out"),
                "--no-plots",
            ],
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - t0
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        row = (Path(tmp) / "out" / "summary.csv").read_text().splitlines()
        print(f"collect: {wall:.1f} s wall, peak RSS {peak_mb:,.0f} MB ({len(row) - 1} row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
