#!/usr/bin/env python3
"""Measure the results store and its dashboard; prints the figures.

    .venv/bin/python scripts/bench_store.py                 # all three
    .venv/bin/python scripts/bench_store.py --only ingest --cells 20 --records 50000
    .venv/bin/python scripts/bench_store.py --site SITE      # open an existing dashboard only

1. ingest: a sweep of CELLS result directories of RECORDS request records each (1,000,000 records in
   all by default; records shaped like the replayer's, about 700 bytes), each with its receipt,
   ingested into a fresh SQLite store by `agentsweep results ingest` in a child process: wall time
   and the child's peak resident memory (targets: under 60 s and 1 GB).
2. dashboard: a store of 500 points (25 runs of 20 cells), its dashboard opened REPEAT times in
   headless Chromium (Debian's, through Playwright) from file:// with networking off, each in a fresh
   context: milliseconds from navigation to the Pareto chart on screen (first_paint_ms, target under
   2 s), and to the same chart drawn by Plotly, interactive (interactive_ms); see open_in_chromium.
3. drill-down: the dashboard of the ingest benchmark's store; one cell's drill-down (RECORDS requests)
   opened as a click does: milliseconds from the request to every chart drawn (target: under 2 s).

The machine's load average is printed beside the figures: browser timings scale with a busy CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "utils"))
sys.path.insert(0, str(REPO / "kv-cache-tester"))

from agentsweep.contract.cell import Cell  # noqa: E402
from agentsweep.contract.receipt import write_receipt  # noqa: E402

START = 1_767_225_600.0
AGENTSWEEP = [sys.executable, "-m", "agentsweep.cli"]
CPU_SECONDS = [0.0]
COLUMNS = (
    "time_s,kv_cache_usage,cpu_kv_cache_usage,requests_running,requests_waiting,prompt_tokens_total,"
    "generation_tokens_total,prefix_cache_queries_total,prefix_cache_hits_total,cpu_cache_hits_total,"
    "preemptions_total,offload_bytes_gpu_to_cpu_total,offload_bytes_cpu_to_gpu_total,requests_finished_total"
)


def _dist(center: float) -> dict[str, float]:
    return {"mean": center, "p50": center, "p90": center * 1.5, "p95": center * 1.7, "p99": center * 2,
            "p99.9": center * 2.5, "std": center / 3}  # fmt: skip


def write_cell(root: Path, exp: str, users: int, records: int, speed: float, rng: random.Random) -> Path:
    """One SUCCESS result directory whose files agree with each other (as collect checks)."""
    path = root / f"agentic_{exp}"
    path.mkdir(parents=True)
    duration = 1800.0
    cell = Cell.parse(
        {"config_key": "bench", "exp_name": exp, "engine": "sim", "model": "bench/model", "tp": 1,
         "users": users, "offload": "on", "duration": int(duration), "traces": "traces", "warmup_requests": 0}
    )  # fmt: skip
    doc = {
        "schema_version": 1,
        "cell": cell.model_dump(mode="json"),
        "engine_command": ["agentsweep", "engine-sim"],
        "engine_env": {},
        "replay_command": ["kv-cache-tester", "replay"],
        "versions": {"agentsweep": "0.1.0", "kv_cache_tester": "0.1.0", "engine": "sim-bench"},
        "start_utc": "2026-01-01T00:00:00Z",
        "end_utc": "2026-01-01T00:30:00Z",
        "status": "SUCCESS",
        "reason": None,
    }
    (path / "cell.json").write_text(json.dumps(doc))
    (path / "status.txt").write_text("SUCCESS\n")
    prompt = cached = output = 0
    with (path / "requests.jsonl").open("wb") as fh:
        for i in range(records):
            t = duration * i / records
            ttft = 0.05 + rng.random() * 0.3 * speed
            out = rng.randint(50, 600)
            e2e = ttft + out * 0.012 * speed
            p_tok = rng.randint(2000, 60000)
            c_tok = int(p_tok * rng.random() * 0.9)
            prompt, cached, output = prompt + p_tok, cached + c_tok, output + out
            rec = {
                "trace_id": f"trace_{i % 400:04d}", "session_id": f"trace_{i % 400:04d}", "user": i % users,
                "turn": i // users, "phase": "profile", "play": 0, "salt": "", "request_id": f"r{i}",
                "t_dispatch": t, "t_done": t + e2e, "dispatch_lag_s": 1e-5, "ttft_s": ttft, "e2e_s": e2e,
                "itl_s": {"mean": 0.012, "p50": 0.011, "p99": 0.03, "max": 0.05, "n": out - 1},
                "tpot_s": 0.012, "prompt_tokens": p_tok, "prompt_tokens_source": "server", "cached_tokens": c_tok,
                "expected_prompt_tokens": p_tok, "output_tokens": out, "expected_output_tokens": out,
                "theoretical_hit_blocks": c_tok // 64, "total_blocks": p_tok // 64, "accepted": True,
                "retries": 0, "status": "ok", "error": None,
            }  # fmt: skip
            fh.write(orjson.dumps(rec) + b"\n")
    summary = {
        "schema_version": 1,
        "counts": {"sent": records, "ok": records, "failed": 0, "failed_by_class": {}, "warmup": 0},
        "window": {"start_unix": START, "end_unix": START + duration, "duration_s": duration},
        "throughput": {"requests_per_s": records / duration, "input_tok_per_s": prompt / duration,
                       "output_tok_per_s": output / duration, "total_tok_per_s": (prompt + output) / duration},
        "latency": {"ttft_s": _dist(0.2 * speed), "tpot_s": _dist(0.012 * speed), "itl_s": _dist(0.012 * speed),
                    "e2e_s": _dist(4.0 * speed), "interactivity_tok_per_s": _dist(80 / speed)},
        "slo": {"ttft_s": None, "tpot_s": None, "goodput_requests_per_s": None, "attainment": None},
        "cache": {"theoretical_hit_rate": 0.5, "client_hit_rate": cached / prompt, "prompt_tokens": prompt,
                  "cached_tokens": cached},
        "users": users,
        "options": {},
        "validity": {"valid": True, "reasons": [], "checks": {}},
    }  # fmt: skip
    (path / "summary.json").write_text(json.dumps(summary))
    rows = [COLUMNS]
    for s in range(int(duration) + 1):
        f = s / duration
        rows.append(
            f"{START + s:.3f},{0.5 + 0.4 * math.sin(s / 50):.4f},0.3,{users},1,{prompt * f:.0f},{output * f:.0f},"
            f"{prompt * f:.0f},{cached * f * 0.8:.0f},{cached * f * 0.2:.0f},0,0,0,{records * f:.0f}"
        )
    (path / "server_metrics.csv").write_text("\n".join(rows) + "\n")
    write_receipt(path, cell, engine_version="sim-bench", commit="0" * 40)
    return path


def run_child(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident memory MiB of the child and its worker processes together,
    sampled every 0.1 s); its CPU seconds (workers included) go to CPU_SECONDS."""
    import psutil

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = usage.ru_utime + usage.ru_stime
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        peak = 0
        tree = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                rss = tree.memory_info().rss + sum(c.memory_info().rss for c in tree.children(recursive=True))
            except psutil.Error:
                rss = 0
            peak = max(peak, rss)
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"{' '.join(argv[:6])}...: exit {proc.returncode}: {err.read()[-2000:].decode()}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_SECONDS[0] = usage.ru_utime + usage.ru_stime - cpu0
    return wall, peak / 2**20


def open_in_chromium(site: Path, drill: int | None, repeat: int = 1) -> dict[str, list[float]]:
    """Open the dashboard ``repeat`` times, each in a fresh browser context (nothing cached), and per
    opening the milliseconds since navigation to:

    - first_paint_ms: the Pareto chart on screen as the page first draws it (every point, the
      frontiers, axes and legend, as SVG), what a user waits for before seeing the results;
    - interactive_ms: the same chart drawn again by Plotly once plotly.js has loaded, on screen
      (zoom, hover; the page's body[data-ready='1']);
    - plotly_loaded_ms: plotly.js loaded and started (it is requested after the first paint);
    - and, with ``drill``, drilldown_ms: from asking for that point's drill-down (as a click does)
      to every drill-down chart painted.
    """
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium not installed (apt-get install chromium)")
    out: dict[str, list[float]] = {}
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        for _ in range(repeat):
            context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
            context.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
            page = context.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((site / "index.html").as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=120_000)
            timings = page.evaluate("window.agentsweep.timings")
            figures = {
                "first_paint_ms": timings["first_paint"],
                "interactive_ms": timings["first_draw"],
                "plotly_loaded_ms": timings["plotly_loaded"],
            }
            if drill is not None:
                page.evaluate("(id) => window.agentsweepOpen(id)", drill)
                page.wait_for_selector(f"#drilldown[data-drawn='1'][data-point='{drill}']", timeout=120_000)
                figures["drilldown_ms"] = page.evaluate("window.agentsweep.timings.drill")
            if errors:
                sys.exit(f"page errors: {errors}")
            for key, value in figures.items():
                out.setdefault(key, []).append(value)
            context.close()
        browser.close()
    return out


def _spread(figures: dict[str, list[float]]) -> str:
    """``name median ms (min-max of n)`` per figure."""
    parts = []
    for key, values in figures.items():
        ordered = sorted(values)
        median = ordered[len(ordered) // 2]
        parts.append(
            f"{key} {median:.0f}"
            + (f" ({ordered[0]:.0f}-{ordered[-1]:.0f} of {len(values)})" if len(values) > 1 else "")
        )
    return ", ".join(parts)


def bench_ingest(work: Path, cells: int, records: int) -> Path:
    root = work / "sweep"
    rng = random.Random(7)
    t0 = time.perf_counter()
    for i in range(cells):
        write_cell(root, f"bench-tp1-ep1-u{64 + i}-on", 64 + i, records, 1.0, rng)
    total = cells * records
    size = sum(f.stat().st_size for f in root.rglob("requests.jsonl"))
    print(f"ingest: wrote {cells} cells, {total:,} records ({size / 1e6:.0f} MB of requests.jsonl) "
          f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    db = work / "ingest.db"
    wall, rss = run_child([*AGENTSWEEP, "results", "ingest", "--db", str(db), str(root)])
    print(f"ingest: {total:,} records in {wall:.1f} s ({CPU_SECONDS[0]:.1f} CPU s), peak RSS {rss:.0f} MiB "
          f"(targets 60 s, 1024 MiB); store {db.stat().st_size / 1e6:.0f} MB")  # fmt: skip
    return db


def bench_dashboard(work: Path, runs: int, per_run: int, repeat: int) -> None:
    db = work / "dash.db"
    rng = random.Random(11)
    for r in range(runs):
        root = work / f"run{r}"
        for i in range(per_run):
            path = write_cell(root, f"bench-tp1-ep1-u{2 + i}-on", 2 + i, 200, 1.0 + 0.01 * r, rng)
            doc = json.loads((path / "cell.json").read_text())
            doc["start_utc"] = f"2026-01-{1 + r // 24:02d}T{r % 24:02d}:00:00Z"
            (path / "cell.json").write_text(json.dumps(doc))
            write_receipt(path, Cell.parse(doc["cell"]), engine_version=f"sim-{r}", commit="0" * 40)
        run_child([*AGENTSWEEP, "results", "ingest", "--db", str(db), str(root), "--label", f"night{r}"])
    site = work / "dash-site"
    wall, _ = run_child([*AGENTSWEEP, "dashboard", "--db", str(db), "-o", str(site)])
    print(f"dashboard: {runs * per_run} points written in {wall:.1f} s")
    figures = open_in_chromium(site, None, repeat)
    print(f"dashboard: {_spread(figures)} (target 2000 ms; load average {os.getloadavg()[0]:.1f})")


def bench_drilldown(work: Path, db: Path, records: int, repeat: int) -> None:
    site = work / "drill-site"
    wall, rss = run_child([*AGENTSWEEP, "dashboard", "--db", str(db), "-o", str(site)])
    print(f"drill-down: dashboard of the ingest store written in {wall:.1f} s (peak RSS {rss:.0f} MiB)")
    size = (site / "data" / "points" / "1.js").stat().st_size
    figures = open_in_chromium(site, 1, repeat)
    print(f"drill-down: one cell of {records:,} requests ({size / 1e6:.1f} MB payload): {_spread(figures)} "
          f"(target 2000 ms drilldown_ms; load average {os.getloadavg()[0]:.1f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--records", type=int, default=50_000, help="request records per cell")
    parser.add_argument("--only", choices=["ingest", "dashboard", "drilldown"])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--repeat", type=int, default=3, help="page openings per browser figure")
    parser.add_argument(
        "--site", type=Path, help="only open this dashboard folder in Chromium (no store built)"
    )
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.site is not None:
        print("dashboard: " + _spread(open_in_chromium(args.site, None, args.repeat)))
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        return
    work = Path(tempfile.mkdtemp(prefix="bench-store-"))
    env_path = f"{REPO / 'utils'}{os.pathsep}{REPO / 'kv-cache-tester'}"
    os.environ["PYTHONPATH"] = env_path + (
        os.pathsep + os.environ["PYTHONPATH"] if "PYTHONPATH" in os.environ else ""
    )
    try:
        if args.only in (None, "ingest", "drilldown"):
            db = bench_ingest(work, args.cells, args.records)
            if args.only in (None, "drilldown"):
                bench_drilldown(work, db, args.records, args.repeat)
        if args.only in (None, "dashboard"):
            bench_dashboard(work, 25, 20, args.repeat)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
