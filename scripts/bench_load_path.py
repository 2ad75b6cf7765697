#!/usr/bin/env python3
"""The load path's figures in one run: is the client ever the limit, is the simulated clock inflated?

Prints, each with the cores the rest of the machine kept busy while it ran (``busy``: a shared
machine's noise, from /proc/stat, this benchmark's own processes excluded where it can tell):

1. ``replayer``: kv-cache-tester/benchmarks/bench_replay.py, once with ``--workers 1`` and once with
   ``--workers 2``: replayer / bare client throughput at 64 and 256 users, the paced TTFT overhead
   (client TTFT minus the server's, p50 and p99) of both clients; its table is printed as it is.
2. ``engine clock``: simulated cells through benchmarks/run_cell.sh and ``agentsweep collect``, at the
   demo's settings (Llama-3.3-70B FP8, H200 TP 1, 24k contexts, speed 50; 2 and 8 users) and with
   1k-token prompts (DeepSeek-R1 FP8, H200 TP 8, speed 20; ``kv-cache-tester synth`` prompts of 1024
   tokens, 256 output tokens; 8 and 32 users). Per cell: the TTFT p50 collect reports, the engine's
   own (its ``--request-log``, the same profile requests), their difference, the client's wall-clock
   TTFT p50 x speed and its gap, the client's share of E2E (the validity check's figure) and the
   verdict.
3. ``engine-sim CPU``: scripts/bench_engine_sim.py against this tree and against the commit before the
   step model grew (``--before``, default the parent of the commit that fitted it), alternating, the
   server pinned to one core: server CPU per request (ms) and requests/s.

4. ``agents per client core``: the replayer at agentic settings (docs/scaleout.md) against the instant
   server (``agents_part``): its CPU share of its core and the users one core drives.

    .venv/bin/python scripts/bench_load_path.py                # everything (about 15 minutes)
    .venv/bin/python scripts/bench_load_path.py --only clock    # one part: replayer, clock, sim, agents
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# The commit that fitted the MoE-aware step model (engine_sim's CPU per request grew with it).
STEP_MODEL_COMMIT = "1725dd7"


# --- the machine ----------------------------------------------------------------------------


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _tree_jiffies(pid: int) -> int:
    """CPU jiffies of ``pid`` and its children that were waited for (utime+stime+cutime+cstime)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            parts = fh.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in parts[11:15])
    except OSError:
        return 0


class Busy:
    """Cores kept busy by everything but this process tree between start() and stop()."""

    def __init__(self) -> None:
        self.cores = os.cpu_count() or 1

    def start(self) -> None:
        self._busy, self._total = _cpu_jiffies()
        self._own = _tree_jiffies(os.getpid())

    def stop(self) -> float:
        busy, total = _cpu_jiffies()
        own = _tree_jiffies(os.getpid()) - self._own
        span = total - self._total
        return max(0.0, (busy - self._busy - own) / span * self.cores) if span > 0 else float("nan")


def run(
    cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 900, ok: tuple[int, ...] = (0,)
) -> str:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if proc.returncode not in ok:
        tail = proc.stdout[-2000:] + proc.stderr[-2000:]
        raise SystemExit(f"{shlex.join(cmd)} exited {proc.returncode}:\n{tail}")
    return proc.stdout


# --- 1. the replayer against a bare client ----------------------------------------------------


def replayer_part(args: argparse.Namespace) -> None:
    for workers in (1, 2):
        print(f"\n== replayer (--workers {workers}) vs bare client: bench_replay.py ==", flush=True)
        cmd = [
            PY, str(ROOT / "kv-cache-tester" / "benchmarks" / "bench_replay.py"),
            "--duration", str(args.replay_duration), "--workers", str(workers),
            "--users", "64,256", "--paced-users", "32" if workers == 1 else "0",
        ]  # fmt: skip
        if args.max_other is not None:
            cmd += ["--max-other", str(args.max_other)]
        busy = Busy()
        busy.start()
        out = run(cmd, timeout=1800)
        print(out.rstrip())
        print(f"busy (whole part, cores kept busy by others): {busy.stop():.2f}", flush=True)


# --- 2. the engine clock in simulated cells ---------------------------------------------------

DEMO = {
    "model": "meta-llama/Llama-3.3-70B-Instruct",
    "precision": "fp8",
    "tp": 1,
    "speed": 50,
    "max_context": 24576,
    "traces": str(ROOT / "kv-cache-tester" / "sample_traces"),
}
ONE_K = {"model": "deepseek-ai/DeepSeek-R1", "precision": "fp8", "tp": 8, "speed": 20, "max_context": 0}


def _cell(
    name: str, base: dict[str, object], users: int, duration: int, request_log: Path
) -> dict[str, object]:
    return {
        "config_key": "clock",
        "exp_name": f"clock-{name}-u{users}",
        "runner": "local",
        "engine": "sim",
        "image": "",
        "users": users,
        "offload": "off",
        "duration": duration,
        "warmup_requests": 1,
        "engine_args": f"--request-log {request_log}",
        **base,
    }


def _p50(values: list[float]) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    mid = (len(values) - 1) / 2
    lo, hi = int(mid), min(int(mid) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (mid - lo)


def clock_part(args: argparse.Namespace, work: Path) -> None:
    from agentsweep.contract.cell import CELL_ENV_VAR
    from kv_cache_tester.replay import read_records

    print("\n== engine clock: simulated cells (TTFT p50 in engine seconds) ==", flush=True)
    synth = work / "synth_1k.jsonl"
    run(
        [
            PY,
            "-m",
            "kv_cache_tester.cli",
            "synth",
            "--isl",
            "1024",
            "--osl",
            "256",
            "--count",
            "400",
            "--output",
            str(synth),
        ]
    )
    one_k = {**ONE_K, "traces": str(synth)}
    header = (
        f"{'cell':<20}{'users':>6}{'reported':>10}{'engine':>10}{'diff':>8}{'client':>10}{'gap':>8}"
        f"{'e2e share':>10}{'status':>9}{'busy':>7}"
    )
    print(header)
    for name, base, users in (("demo", DEMO, 2), ("demo", DEMO, 8), ("1k", one_k, 8), ("1k", one_k, 32)):
        results = work / "results" / f"{name}-u{users}"
        log = work / f"engine-{name}-u{users}.jsonl"
        cell = _cell(name, base, users, args.cell_duration, log)
        result_dir = results / "clock" / str(cell["exp_name"])
        env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
        env.update({CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(result_dir)})
        busy = Busy()
        busy.start()
        subprocess.run(
            [str(ROOT / "benchmarks" / "run_cell.sh"), "--health-timeout", "60"],
            env=env, capture_output=True, text=True, timeout=args.cell_duration + 240, cwd=ROOT,
        )  # fmt: skip
        others = busy.stop()
        # status 1: a cell that is not SUCCESS (its row says so)
        run([PY, "-m", "agentsweep.cli", "collect", str(results), str(results / "aggregated")], ok=(0, 1))
        with (results / "aggregated" / "summary.csv").open(newline="") as fh:
            row = next(csv.DictReader(fh))
        if not (result_dir / "requests.jsonl").is_file():
            print(f"{name:<20}{users:>6}  {row['status']}: {row['reason'][:200]}", flush=True)
            continue
        profile = {
            r["request_id"]
            for r in read_records(result_dir / "requests.jsonl")
            if r.get("phase") == "profile" and r.get("status") == "ok"
        }
        engine = [
            e["ttft_s"]
            for line in log.read_text().splitlines()
            if (e := json.loads(line)).get("request_id") in profile and e.get("ttft_s") is not None
        ]
        own = _p50(engine)

        def num(key: str, row: dict[str, str] = row) -> float:
            value = row.get(key) or ""
            return float(value) if value else float("nan")

        reported = num("ttft_p50_s")
        print(
            f"{name:<20}{users:>6}{reported:>10.4f}{own:>10.4f}{(reported / own - 1):>8.1%}"
            f"{num('client_ttft_p50_s'):>10.4f}{num('client_gap_ttft_p50'):>8.1%}{num('client_share_e2e'):>10.1%}"
            f"{row['status']:>9}{others:>7.2f}",
            flush=True,
        )
    print(
        "reported: summary.csv ttft_p50_s; engine: p50 of the engine's --request-log TTFT over the same "
        "profile requests; client: client_ttft_p50_s (wall x speed); gap: client / engine - 1; e2e share: "
        "client_share_e2e (validity limit 50%); busy: cores other processes kept busy"
    )


# --- 3. the simulator's CPU per request against the commit before the step model -------------


def sim_part(args: argparse.Namespace, work: Path) -> None:
    before = (
        args.before
        or subprocess.run(
            ["git", "rev-parse", f"{STEP_MODEL_COMMIT}^"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout.strip()
    )
    old = work / "before"
    old.mkdir()
    archive = subprocess.run(["git", "archive", before, "utils"], capture_output=True, cwd=ROOT, check=True)
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    print(
        f"\n== engine-sim CPU per request: this tree vs {before[:10]} (before the step model) ==", flush=True
    )
    print(f"{'round':>5}  {'tree':<8}{'req/s':>9}{'ms CPU/req':>12}{'server cpu':>12}{'busy':>7}")
    bench = [PY, str(ROOT / "scripts" / "bench_engine_sim.py"), "--duration", str(args.sim_duration)]
    figures: dict[str, list[float]] = {"now": [], "before": []}
    for k in range(args.sim_rounds):
        for tree in ("before", "now") if k % 2 == 0 else ("now", "before"):
            env = dict(os.environ)
            if tree == "before":  # the old package shadows the installed one in the server's process
                env["PYTHONPATH"] = str(old / "utils")
            busy = Busy()
            busy.start()
            out = run([*bench], env=env)
            others = busy.stop()
            rps = _figure(out, r"requests_per_s\s+([\d.,]+)")
            per_cpu_s = _figure(out, r"requests_per_server_cpu_s\s+([\d.,]+)")
            per_req = 1000.0 / per_cpu_s if per_cpu_s else float("nan")
            share = _figure(out, r"server_cpu_share\s+([\d.,]+)")
            figures[tree].append(per_req)
            print(f"{k + 1:>5}  {tree:<8}{rps:>9.1f}{per_req:>12.3f}{share:>12.2f}{others:>7.2f}", flush=True)
    med = {t: sorted(v)[len(v) // 2] for t, v in figures.items() if v}
    if len(med) == 2:
        print(
            f"median ms CPU/request: before {med['before']:.3f}, now {med['now']:.3f} ({med['now'] / med['before'] - 1:+.0%})"
        )


# --- 4. agents per client core at the agentic preset --------------------------------------


def agents_part(args: argparse.Namespace, work: Path) -> None:
    """The replayer at agentic settings (start 25-75% into each trace after a warm-up request, gaps
    capped at 10 s, outputs to the trace's length: the agentx preset before it took InferenceX's
    current settings, docs/replay-parity.md) against the instant server streaming one token every
    --agent-itl-ms with no prefill time (so each agent asks as often as it can: a conservative
    figure), for --agent-duration s (the flags given one by one): the replayer's CPU share of its
    core, and users / that share."""
    from kv_cache_tester.replay import load_summary

    print(f"\n== agents per client core, agentic settings ({args.agent_users} users) ==", flush=True)
    server = subprocess.Popen(
        [PY, str(ROOT / "kv-cache-tester" / "benchmarks" / "instant_server.py"), "--port", "0",
         "--itl-ms", str(args.agent_itl_ms)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        out = work / "agents"
        busy = Busy()
        busy.start()
        run(
            [PY, "-m", "kv_cache_tester.cli", "replay", "--api-endpoint", f"http://127.0.0.1:{port}",
             "--model", "instant", "--trace-directory", str(_copies(work / "agent_traces", args.agent_users)),
             "--output-dir", str(out), "--max-users", str(args.agent_users), "--recycle",
             "--test-duration", str(args.agent_duration), "--advance-min", "0.25", "--advance-max", "0.75",
             "--max-delay", "10", "--ignore-eos", "--warmup-requests-per-user", "1",
             "--no-color", "--no-plot"],
            timeout=args.agent_duration + 600,
        )  # fmt: skip
        others = busy.stop()
    finally:
        server.terminate()
        server.wait(10)
    summary = load_summary(out)
    share = summary["self_audit"]["client_cpu_share"] or float("nan")
    rps = summary["throughput"]["requests_per_s"] or float("nan")
    out_tps = summary["throughput"]["output_tok_per_s"] or float("nan")
    print(
        f"{'users':>6}{'req/s':>8}{'out tok/s':>11}{'client cpu':>12}{'ms CPU/req':>12}{'agents/core':>13}{'busy':>7}"
    )
    print(
        f"{args.agent_users:>6}{rps:>8.1f}{out_tps:>11.0f}{share:>12.2f}{share / rps * 1000:>12.2f}"
        f"{args.agent_users / share:>13.0f}{others:>7.2f}"
    )


def _copies(dst: Path, users: int) -> Path:
    """The sample traces, copied under new ids until every user has one of its own."""
    src = sorted((ROOT / "kv-cache-tester" / "sample_traces").glob("*.json"))
    dst.mkdir(parents=True, exist_ok=True)
    for k in range(-(-2 * users // len(src))):
        for path in src:
            trace = json.loads(path.read_text())
            trace["id"] = f"{trace['id']}-c{k}"
            (dst / f"{trace['id']}.json").write_text(json.dumps(trace))
    return dst


def _figure(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    return float(m.group(1).replace(",", "")) if m else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument(
        "--only", choices=("replayer", "clock", "sim", "agents"), action="append", help="run only these parts"
    )
    ap.add_argument("--replay-duration", type=float, default=20.0, help="bench_replay.py --duration")
    ap.add_argument("--max-other", type=float, default=None, help="bench_replay.py --max-other")
    ap.add_argument("--cell-duration", type=int, default=15, help="each simulated cell's duration (s)")
    ap.add_argument("--sim-duration", type=float, default=12.0, help="bench_engine_sim.py --duration")
    ap.add_argument("--sim-rounds", type=int, default=3, help="alternating rounds of each tree")
    ap.add_argument("--before", help="the engine-sim commit to compare with (default: before the step model)")
    ap.add_argument("--agent-users", type=int, default=128, help="users of the agentic client-core run")
    ap.add_argument("--agent-duration", type=int, default=120, help="its duration (s)")
    ap.add_argument(
        "--agent-itl-ms", type=float, default=20.0, help="the instant server's gap between tokens"
    )
    ap.add_argument("--keep", type=Path, help="keep the work files here")
    args = ap.parse_args()
    parts = args.only or ["replayer", "clock", "sim", "agents"]
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_load_path_"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    try:
        if "replayer" in parts:
            replayer_part(args)
        if "clock" in parts:
            clock_part(args, work)
        if "sim" in parts:
            sim_part(args, work)
        if "agents" in parts:
            agents_part(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
