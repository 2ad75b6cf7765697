#!/usr/bin/env python3
"""Benchmark the replayer against a bare asyncio client on an instant streaming server; prints both.

Method: the server (instant_server.py) is pinned to core 0, the client to core 1 (taskset, when
there are two cores); a fresh server for every run. Each scenario runs twice, once with the
replayer and once with bare_client.py (the floor for a Python client: keep-alive, no parsing), and
the command prints both throughputs and their ratio. Workload: the sample traces with every request
cut to at most 20k input tokens (its first hash blocks) and 64 output tokens, copied under new ids
until there are more traces than users; --recycle, no delays; the bare client sends a body of the
same size (body_kib). Throughput counts requests completed inside the window (after --warmup
seconds); client_cpu and server_cpu are each process's CPU share of its core over the run. TTFT
overhead = client TTFT - the server's own TTFT, per request id, in a run paced to about 50 req/s
(32 users, 10 ms between tokens); the paced row is also run with the replayer's --busy-poll.
RSS is sampled every second. --repeat N runs everything N times, in turns, and prints medians.

    python kv-cache-tester/benchmarks/bench_replay.py [--duration 20] [--warmup 5] [--users 64,256]

RSS over a long run (one scenario, 10 minutes):

    python kv-cache-tester/benchmarks/bench_replay.py --users 64 --paced-users 0 --duration 600 --warmup 10

The same workload against the simulated engine instead (``--server engine-sim``, this repository's
environment): client_cpu and server_cpu then show which of the pair is the bottleneck.

    python kv-cache-tester/benchmarks/bench_replay.py --server engine-sim --users 64,256
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kv_cache_tester.replay import REQUESTS_FILE, load_summary, read_records
from kv_cache_tester.stats import percentile

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENTRY = ROOT / "trace_replay_tester.py"
SERVER = HERE / "instant_server.py"
BARE = HERE / "bare_client.py"
MAX_IN = 20000
OUT_TOKENS = 64


def pct(values: list[float], q: float) -> float:
    """Percentile q (0-100) of unsorted values; NaN when there are none."""
    value = percentile(sorted(values), q)
    return float("nan") if value is None else value


def cut_request(r: dict, block: int) -> dict:
    r = dict(r)
    if r.get("type") == "subagent":
        r["requests"] = [cut_request(x, block) for x in r["requests"]]
        return r
    if r["in"] > MAX_IN:
        r["in"] = MAX_IN
        r["hash_ids"] = r["hash_ids"][: -(-MAX_IN // block)]
    r["out"] = OUT_TOKENS
    return r


def prepare_traces(src: Path, dst: Path, copies_needed: int) -> int:
    """Cut every request to MAX_IN tokens and OUT_TOKENS outputs; copy until enough traces."""
    dst.mkdir(parents=True, exist_ok=True)
    base = [json.loads(p.read_text()) for p in sorted(src.glob("*.json"))]
    n = 0
    copy = 0
    while n < copies_needed:
        for tr in base:
            t = dict(tr)
            t["id"] = f"{tr['id']}_c{copy}"
            t["requests"] = [cut_request(r, tr.get("block_size", 64)) for r in tr["requests"][:120]]
            (dst / f"{t['id']}.json").write_text(json.dumps(t))
            n += 1
        copy += 1
    return n


def taskset(core: int) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(core)]
    return []


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants (the replayer's --workers children)."""
    total = cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        total += sum(tree_cpu(int(c)) for c in children)
    return total


def machine_busy() -> float:
    """CPU seconds all cores have spent busy since boot (Linux /proc/stat; 0 elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def wait_quiet(limit_s: float, cores: float = 0.15, probe_s: float = 2.0) -> float:
    """Wait (at most ``limit_s``) until the machine has kept fewer than ``cores`` busy over a probe
    of ``probe_s``: on a shared machine, a scenario then starts when others are idle. Returns the
    cores busy in the last probe."""
    deadline = time.monotonic() + limit_s
    while True:
        busy0 = machine_busy()
        time.sleep(probe_s)
        busy = (machine_busy() - busy0) / probe_s
        if busy < cores or time.monotonic() >= deadline:
            return busy


def start_server(itl_ms: float, record: Path) -> tuple[subprocess.Popen[str], int]:
    cmd = [*taskset(0), sys.executable, str(SERVER), "--port", "0", "--itl-ms", str(itl_ms)]
    cmd += ["--force-output-tokens", str(OUT_TOKENS), "--record", str(record)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"instant server did not start: {line!r}")
    return proc, int(line.split()[1])


def start_engine_sim(sim_args: str, log: list[str]) -> tuple[subprocess.Popen[str], int]:
    """The simulated engine (``agentsweep engine-sim``, from this repository's environment); its
    output lines are appended to ``log``."""
    cmd = [
        *taskset(0),
        sys.executable,
        "-m",
        "agentsweep.cli",
        "engine-sim",
        *sim_args.split(),
        "--port",
        "0",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        log.append(line)
        m = re.search(r"Uvicorn running on http://[^:]+:(\d+)", line)
        if m:
            threading.Thread(target=lambda: log.extend(proc.stdout or ()), daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    raise SystemExit("engine-sim did not start (is agentsweep installed here?):\n" + "".join(log[-20:]))


def window_figures(
    recs: list[dict], ok: list[dict], record: Path, args: argparse.Namespace
) -> tuple[list[dict], float, list[float], float]:
    """The requests that finished ok inside the window, the mean in flight, the TTFT overheads
    (client - server, per request id) and the mean request body size the server read (KiB)."""
    total = args.warmup + args.duration
    first_t = min(r["t_dispatch"] for r in recs)
    w0, w1 = first_t + args.warmup, first_t + total
    win = [r for r in ok if w0 <= r["t_done"] <= w1]
    busy = sum(
        min(r["t_done"], w1) - max(r["t_dispatch"], w0)
        for r in recs
        if r["t_done"] >= w0 and r["t_dispatch"] <= w1
    )
    server: dict[str, tuple[float, int]] = {}
    if record.exists():
        for line in record.read_text().splitlines():
            d = json.loads(line)
            server[d["request_id"]] = (d["ttft_s"], d.get("body_bytes", 0))
    over = [r["ttft_s"] - server[r["request_id"]][0] for r in win if r["request_id"] in server]
    sizes = [server[r["request_id"]][1] for r in win if r["request_id"] in server]
    return win, busy / args.duration, over, (sum(sizes) / len(sizes) / 1024) if sizes else math.nan


def start(cmd: list[str]) -> tuple[subprocess.Popen[str], float]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), time.monotonic()


def watch(
    proc: subprocess.Popen[str], t_start: float, server_pid: int, window: tuple[float, float]
) -> tuple[list[tuple[float, float]], float]:
    """Until the client ends: its RSS every second (seconds after the start, MiB), and the cores the
    rest of the machine kept busy during ``window`` (seconds after the start): what was running
    beside the server and the client."""
    rss: list[tuple[float, float]] = []
    marks: list[tuple[float, float, float]] = []  # (time, machine busy, server + client CPU)
    while proc.poll() is None:
        now = time.monotonic() - t_start
        r = rss_mib(proc.pid)
        if r is not None:
            rss.append((now, r))
        if len(marks) < 2 and now >= window[len(marks)]:
            marks.append((now, machine_busy(), cpu_seconds(server_pid) + tree_cpu(proc.pid)))
        time.sleep(min(1.0, max(0.01, window[len(marks)] - now)) if len(marks) < 2 else 1.0)
    if len(marks) < 2:
        return rss, math.nan
    (t0, busy0, ours0), (t1, busy1, ours1) = marks
    return rss, ((busy1 - busy0) - (ours1 - ours0)) / (t1 - t0)


def stop_server(server: subprocess.Popen[str]) -> None:
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)
    time.sleep(0.2)  # let a log reader take the last lines
    if server.stdout:
        server.stdout.close()


def scenario(
    name: str,
    users: int,
    itl_ms: float,
    traces: Path,
    work: Path,
    args: argparse.Namespace,
    extra: tuple[str, ...] = (),
) -> dict:
    """One run of the replayer."""
    wait_quiet(args.quiet_wait)
    out = work / name
    record = work / f"{name}_server.jsonl"
    sim_log: list[str] = []
    if args.server == "engine-sim":
        server, port = start_engine_sim(args.sim_args, sim_log)
    else:
        server, port = start_server(itl_ms, record)
    server_cpu0 = cpu_seconds(server.pid)
    total = args.warmup + args.duration
    cmd = [*taskset(1), sys.executable, str(ENTRY), "--api-endpoint", f"http://127.0.0.1:{port}"]
    cmd += ["--trace-directory", str(traces), "--output-dir", str(out), "--max-users", str(users)]
    cmd += ["--recycle", "--time-scale", "1e-9", "--max-context", "0", "--test-duration", str(total)]
    cmd += ["--no-plot", "--no-color", "--grace-period", "5"]
    if args.server == "instant":
        cmd += ["--model", "instant"]
    cmd += ["--workers", str(args.workers), *extra]
    rep, t_start = start(cmd)
    rss, other = watch(rep, t_start, server.pid, (args.warmup, total - 0.5))
    err = rep.stderr.read() if rep.stderr else ""
    for pipe in (rep.stdout, rep.stderr):
        if pipe:
            pipe.close()
    wall = time.monotonic() - t_start
    server_cpu = cpu_seconds(server.pid) - server_cpu0
    stop_server(server)
    late = [re.search(r"Simulated clock: ([\d.]+)%.* ([\d.]+) ms \(wall\) late", line) for line in sim_log]
    sim_late, sim_lag = next(
        ((float(m.group(1)), float(m.group(2))) for m in late if m), (math.nan, math.nan)
    )
    if rep.returncode != 0:
        raise SystemExit(f"{name}: replayer exited {rep.returncode}: {err[-2000:]}")
    summ = load_summary(out)
    recs = read_records(out / REQUESTS_FILE)
    win, in_flight, over, body_kib = window_figures(
        recs, [r for r in recs if r["status"] == "ok"], record, args
    )
    in_win_rss = [m for t, m in rss if args.warmup <= t <= total]
    cpu = summ["self_audit"]["client_cpu_s"]
    return {
        "scenario": name,
        "client": "replayer",
        "users": users,
        "req_s": len(win) / args.duration,
        "in_flight": in_flight,
        "cpu_ms_req": 1000 * cpu / max(1, len(recs)),
        "ttft_p50_ms": 1000 * pct([r["ttft_s"] for r in win], 50),
        "over_p50_ms": 1000 * pct(over, 50),
        "over_p99_ms": 1000 * pct(over, 99),
        "spread_ms": 1000 * (summ["self_audit"]["first_dispatch_spread_s"] or 0),
        "client_cpu": cpu / wall,
        "server_cpu": server_cpu / wall,
        "body_kib": body_kib,
        "other_cpu": other,
        "sim_late_pct": sim_late,
        "sim_lag_ms": sim_lag,
        "rss_start": in_win_rss[0] if in_win_rss else math.nan,
        "rss_mid": in_win_rss[len(in_win_rss) // 2] if in_win_rss else math.nan,
        "rss_end": in_win_rss[-1] if in_win_rss else math.nan,
        "rss_max": max(in_win_rss) if in_win_rss else math.nan,
        "failed": summ["counts"]["failed"],
    }


def bare_scenario(name: str, users: int, itl_ms: float, work: Path, args: argparse.Namespace) -> dict:
    """One run of the bare client, on the same kind of fresh server."""
    wait_quiet(args.quiet_wait)
    record = work / f"{name}_server.jsonl"
    out = work / f"{name}.jsonl"
    server, port = start_server(itl_ms, record)
    server_cpu0 = cpu_seconds(server.pid)
    total = args.warmup + args.duration
    cmd = [*taskset(1), sys.executable, str(BARE), "--port", str(port), "--users", str(users)]
    cmd += ["--duration", str(total), "--prompt-words", str(MAX_IN), "--max-tokens", str(OUT_TOKENS)]
    cmd += ["--out", str(out)]
    proc, t_start = start(cmd)
    rss, other = watch(proc, t_start, server.pid, (args.warmup, total - 0.5))
    stdout = proc.stdout.read() if proc.stdout else ""
    err = proc.stderr.read() if proc.stderr else ""
    for pipe in (proc.stdout, proc.stderr):
        if pipe:
            pipe.close()
    wall = time.monotonic() - t_start
    server_cpu = cpu_seconds(server.pid) - server_cpu0
    stop_server(server)
    m = re.search(r"DONE (\d+) cpu ([\d.]+)", stdout)
    if proc.returncode != 0 or not m:
        raise SystemExit(f"{name}: bare client exited {proc.returncode}: {err[-2000:]}")
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    win, in_flight, over, body_kib = window_figures(recs, recs, record, args)
    cpu = float(m.group(2))
    in_win_rss = [mib for t, mib in rss if args.warmup <= t <= total]
    nan = math.nan
    return {
        "scenario": name,
        "client": "bare",
        "users": users,
        "req_s": len(win) / args.duration,
        "in_flight": in_flight,
        "cpu_ms_req": 1000 * cpu / max(1, len(recs)),
        "ttft_p50_ms": 1000 * pct([r["ttft_s"] for r in win], 50),
        "over_p50_ms": 1000 * pct(over, 50),
        "over_p99_ms": 1000 * pct(over, 99),
        "spread_ms": nan,
        "client_cpu": cpu / wall,
        "server_cpu": server_cpu / wall,
        "body_kib": body_kib,
        "other_cpu": other,
        "sim_late_pct": nan,
        "sim_lag_ms": nan,
        "rss_start": in_win_rss[0] if in_win_rss else nan,
        "rss_mid": in_win_rss[len(in_win_rss) // 2] if in_win_rss else nan,
        "rss_end": in_win_rss[-1] if in_win_rss else nan,
        "rss_max": max(in_win_rss) if in_win_rss else nan,
        "failed": 0,
    }


def clean(run: Callable[[], dict], args: argparse.Namespace) -> dict:
    """``run`` again (up to --attempts times in all) while other processes kept more than
    --max-other cores busy during its window; the last attempt stands, with their number."""
    for attempt in range(1, args.attempts + 1):
        row = run()
        row["attempts"] = attempt
        if args.max_other is None or not row["other_cpu"] > args.max_other:
            break
    return row


def one_round(traces: Path, work: Path, args: argparse.Namespace, users: list[int]) -> list[dict]:
    """Every scenario once: for each, the bare client, then the replayer (same server settings)."""
    rows = []
    bare = args.server == "instant" and args.bare
    for u in users:
        if bare:
            rows.append(clean(lambda u=u: bare_scenario(f"bare{u}", u, 0.0, work, args), args))
        rows.append(clean(lambda u=u: scenario(f"u{u}", u, 0.0, traces, work, args), args))
    if args.paced_users > 0 and args.server == "instant":  # overhead needs the server's own TTFT
        paced, pu = f"paced{args.paced_users}", args.paced_users
        if bare:
            rows.append(clean(lambda: bare_scenario(f"bare-{paced}", pu, 10.0, work, args), args))
        rows.append(clean(lambda: scenario(paced, pu, 10.0, traces, work, args), args))
        if args.busy_poll_row:
            bp = ("--busy-poll",)
            rows.append(clean(lambda: scenario(f"{paced}+bp", pu, 10.0, traces, work, args, bp), args))
    return rows


def median_rows(rounds: list[list[dict]]) -> list[dict]:
    """Per scenario, the median of every figure over the rounds."""
    out = []
    for i, row in enumerate(rounds[0]):
        merged = dict(row)
        merged["attempts"] = sum(r[i]["attempts"] for r in rounds)
        for key, value in row.items():
            if isinstance(value, float):
                values = [r[i][key] for r in rounds if not math.isnan(r[i][key])]
                merged[key] = statistics.median(values) if values else math.nan
        out.append(merged)
    return out


def print_table(rows: list[dict]) -> None:
    cols = [
        ("scenario", "{:<13}"), ("users", "{:>5}"), ("req_s", "{:>8.1f}"), ("in_flight", "{:>9.1f}"),
        ("cpu_ms_req", "{:>10.2f}"), ("ttft_p50_ms", "{:>11.2f}"), ("over_p50_ms", "{:>11.2f}"),
        ("over_p99_ms", "{:>11.2f}"), ("spread_ms", "{:>9.1f}"), ("client_cpu", "{:>10.2f}"),
        ("server_cpu", "{:>10.2f}"), ("other_cpu", "{:>9.2f}"), ("body_kib", "{:>8.1f}"), ("sim_late_pct", "{:>12.1f}"),
        ("sim_lag_ms", "{:>10.2f}"), ("rss_start", "{:>9.0f}"), ("rss_mid", "{:>7.0f}"),
        ("rss_end", "{:>7.0f}"), ("rss_max", "{:>7.0f}"), ("failed", "{:>6}"), ("attempts", "{:>8}"),
    ]  # fmt: skip
    print(" | ".join(f"{c:>{len(fmt.format(rows[0][c]))}}" for c, fmt in cols))
    for row in rows:
        print(" | ".join(fmt.format(row[c]) for c, fmt in cols))


def print_comparison(rows: list[dict], rounds: list[list[dict]], args: argparse.Namespace) -> None:
    """The replayer against the bare client: throughput ratio per user count, paced TTFT overhead."""
    by = {r["scenario"]: r for r in rows}
    for u in [r["users"] for r in rows if r["scenario"] == f"u{r['users']}"]:
        rep, bare = by.get(f"u{u}"), by.get(f"bare{u}")
        if rep is None or bare is None:
            continue
        pairs = [(_row(r, f"u{u}")["req_s"], _row(r, f"bare{u}")["req_s"]) for r in rounds]
        ratios = [a / b for a, b in pairs if b > 0]
        each = ", ".join(f"{x:.2f}" for x in ratios)
        print(
            f"{u:>4} users: replayer {rep['req_s']:.0f} req/s, bare client {bare['req_s']:.0f} req/s, "
            f"ratio {statistics.median(ratios):.2f}" + (f" (runs: {each})" if len(ratios) > 1 else "")
        )
    paced = f"paced{args.paced_users}"
    rep, bare = by.get(paced), by.get(f"bare-{paced}")
    if rep is not None and bare is not None:
        print(
            f"paced {args.paced_users} users (~{rep['req_s']:.0f} req/s): TTFT overhead p50/p99 replayer "
            f"{rep['over_p50_ms']:.2f}/{rep['over_p99_ms']:.2f} ms, bare client "
            f"{bare['over_p50_ms']:.2f}/{bare['over_p99_ms']:.2f} ms, difference "
            f"{rep['over_p50_ms'] - bare['over_p50_ms']:+.2f}/{rep['over_p99_ms'] - bare['over_p99_ms']:+.2f} ms"
        )


def _row(rows: list[dict], name: str) -> dict:
    return next(r for r in rows if r["scenario"] == name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0, help="measured window (s)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds before the window")
    ap.add_argument("--users", default="64,256", help="user counts of the throughput runs")
    ap.add_argument(
        "--paced-users", type=int, default=32, help="users of the ~50 req/s overhead run (0: skip it)"
    )
    ap.add_argument("--workers", type=int, default=1, help="the replayer's --workers")
    ap.add_argument("--repeat", type=int, default=1, help="run every scenario this many times; print medians")
    ap.add_argument(
        "--bare", action=argparse.BooleanOptionalAction, default=True, help="also run the bare client"
    )
    ap.add_argument(
        "--busy-poll-row",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the paced scenario with the replayer's --busy-poll",
    )
    ap.add_argument("--traces", type=Path, default=ROOT / "sample_traces")
    ap.add_argument(
        "--server",
        choices=("instant", "engine-sim"),
        default="instant",
        help="what the replayer drives: the instant server (measures the replayer) or the simulated "
        "engine (measures the pair: is the simulator the bottleneck?)",
    )
    ap.add_argument(
        "--sim-args",
        default="meta-llama/Llama-3.3-70B-Instruct-FP8 --tensor-parallel-size 2 --hardware h200 --speed 1000",
        help="engine-sim model and flags for --server engine-sim",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="before each run, wait up to this many seconds for the rest of the machine to be idle "
        "(a shared machine; other_cpu shows what ran beside it anyway)",
    )
    ap.add_argument(
        "--max-other",
        type=float,
        default=None,
        help="rerun a scenario whose window saw other processes keep more than this many cores busy",
    )
    ap.add_argument(
        "--attempts", type=int, default=4, help="at most this many runs per scenario (--max-other)"
    )
    ap.add_argument("--keep", type=Path, help="keep the work files here")
    args = ap.parse_args()
    users = [int(u) for u in args.users.split(",") if u]
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_replay_"))
    work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    try:
        traces = work / "traces"
        n = prepare_traces(args.traces, traces, max([*users, args.paced_users]) + 20)
        print(f"{n} traces (requests cut to {MAX_IN} input tokens, {OUT_TOKENS} output tokens)", flush=True)
        rounds = []
        for k in range(args.repeat):
            rounds.append(one_round(traces, work, args, users))
            print(f"round {k + 1}/{args.repeat} done", file=sys.stderr, flush=True)
        if not rounds[0]:
            raise SystemExit("nothing to run: give --users and/or --paced-users")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    rows = median_rows(rounds)
    print_table(rows)
    print_comparison(rows, rounds, args)
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    print(
        f"(window {args.duration:.0f} s after {args.warmup:.0f} s warmup; "
        f"{'medians of ' + str(args.repeat) + ' rounds; ' if args.repeat > 1 else ''}"
        f"replayer --workers {args.workers}; in_flight = mean requests in flight; "
        "over = client TTFT - server TTFT; body_kib = mean request body the server read; "
        "other_cpu = cores kept busy by other processes during the window (a shared machine's noise); "
        "rss in MiB at window start/middle/end, and its max; attempts = runs made (--max-other); "
        "sim_late_pct = engine-sim steps already due when computed (its CPU was the limit for those), "
        "sim_lag_ms = their mean lateness per step; pinning: "
        f"{'server core 0, client core 1' if taskset(0) else 'none'}; "
        f"load average {load:.2f} at the start, {load_end:.2f} at the end)"
    )


if __name__ == "__main__":
    main()
