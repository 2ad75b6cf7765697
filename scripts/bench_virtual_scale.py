"""How the virtual clock's cost grows with agents and with engine-seconds.

Runs simulated cells with ``clock: virtual`` (as `agentsweep cell` runs them, one process each) on
one simulated 8-GPU node (TP 8), or on ``--replicas`` such engines behind the in-process router (a
rack: ``--replicas 9 --tp 8`` is 72 GPUs), for a grid of concurrent agents x engine-seconds, and
prints per run the wall time, the CPU, the peak memory, the requests and the engine-seconds per wall
second. More agents than the shipped traces need more traces: the shipped ones are copied under new
ids (their content is local to each trace, so copies share no prefix).

    .venv/bin/python scripts/bench_virtual_scale.py [--users 16,32,64] [--seconds 300,600] [--hardware h200]
        [--tp 8] [--replicas 1] [--router consistent_hash]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from agentsweep.contract.cell import CELL_ENV_VAR

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "kv-cache-tester" / "sample_traces"


def trace_copies(root: Path, copies: int) -> Path:
    """``copies`` of every shipped trace, each under its own id."""
    out = root / f"traces-x{copies}"
    if out.exists():
        return out
    out.mkdir(parents=True)
    for path in sorted(SAMPLE.glob("*.json")):
        data = json.loads(path.read_text())
        for k in range(copies):
            data["id"] = f"{path.stem}-c{k}"
            (out / f"{path.stem}-c{k}.json").write_text(json.dumps(data))
    shutil.copy(SAMPLE / "LICENSE", out / "LICENSE")
    return out


def run(
    root: Path, users: int, engine_s: int, hardware: str, tp: int, replicas: int = 1, router: str = ""
) -> dict[str, float]:
    n_traces = len(list(SAMPLE.glob("*.json")))
    # max_context leaves out about a quarter of the traces: half again the copies the agents need leaves
    # enough (a 4,096-agent rack loads 6,160 traces, 3.3 GB of JSON).
    traces = trace_copies(root, max(2, -(-3 * users // (2 * n_traces))))
    cell = {
        "config_key": "scale", "exp_name": f"scale-{hardware}-tp{tp}x{replicas}-u{users}-{engine_s}s", "runner": "local",
        "engine": "sim", "hardware": hardware, "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8",
        "tp": tp, "users": users, "offload": "off", "duration": engine_s, "speed": 1, "clock": "virtual",
        "traces": str(traces), "max_context": 32768, "max_lane_idle_s": 3600,
        **({"replicas": replicas, "router": router} if replicas > 1 else {}),
    }  # fmt: skip
    rd = root / "cells" / str(cell["exp_name"])
    shutil.rmtree(rd, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "RESULT_DIR", "PORT")}
    env |= {CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(rd), "AGENTSWEEP_REPLAY_PLOT": "off"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [str(REPO / "benchmarks" / "run_cell.sh")], env=env, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads((rd / "summary.json").read_text()) if (rd / "summary.json").exists() else {}
    status = (rd / "status.txt").read_text().split("\n")[0] if (rd / "status.txt").exists() else "?"
    return {
        "users": users,
        "engine_s": engine_s,
        "status": status,
        "wall_s": wall,
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "peak_rss_mib": after.ru_maxrss / 1024,
        "requests": summary.get("counts", {}).get("sent", 0),
        "gpus": tp * replicas,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", default="16,32,64")
    parser.add_argument("--seconds", default="300,600", help="engine-seconds per run (comma list)")
    parser.add_argument("--hardware", default="h200")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=1, help="engines of --tp GPUs behind the router")
    parser.add_argument("--router", default="consistent_hash", help="the router policy (with --replicas)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-virtual-scale-"))
    print(
        f"{'gpus':>5} {'agents':>6} {'engine s':>8} {'status':>8} {'wall s':>7} {'cpu s':>7} {'peak MiB':>9} "
        f"{'requests':>9} {'engine s / wall s':>18}"
    )
    for users in (int(u) for u in args.users.split(",")):
        for seconds in (int(s) for s in args.seconds.split(",")):
            r = run(root, users, seconds, args.hardware, args.tp, args.replicas, args.router)
            print(
                f"{r['gpus']:5} {r['users']:6} {r['engine_s']:8} {r['status']:>8} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} "
                f"{r['peak_rss_mib']:9.0f} {r['requests']:9} {r['engine_s'] / r['wall_s']:18.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
