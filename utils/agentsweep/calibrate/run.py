"""One calibration row through the real path: the simulated engine (a subprocess, configured like the
row) driven by ``kv-cache-tester replay`` (a subprocess) with a closed loop of ``conc`` users sending
``kv-cache-tester synth`` random prompts of the row's input and output lengths.

Latencies are read from the engine's own per-request timeline (``--request-log``, simulated seconds):
at a ``--speed`` of S, each millisecond the HTTP path costs on the wall clock would add S ms to a
client-measured TTFT. The replayer's summary is kept beside it as a cross-check. The first request of
every user (all users arriving at once) is left out, as a benchmark's warm-up would be.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kv_cache_tester.replay import ResultError, load_summary
from kv_cache_tester.traces.synth import LengthSpec, synth_workload

from agentsweep.calibrate.points import Point
from agentsweep.calibrate.steady import (
    CHUNK,
    KV_CACHE_DTYPE,
    Timeline,
    figures,
    length_bounds,
    measured,
    point_figures,
)
from agentsweep.engine_sim.profiles import deploy
from agentsweep.watchdog import die_with_parent

START_TIMEOUT_S = 30.0
# Request cycles per user a real-path row runs, the first wave included: fewer than the stand-in's ten,
# to keep each row's clock speed-up (and the simulator's late steps) low in the wall seconds it is given.
CYCLES = 3
_URL = re.compile(r"Uvicorn running on (http://\S+)")
_LATE = re.compile(
    r"Simulated clock: ([\d.]+)% of (\d+) engine steps were already due .*?([\d.]+) ms \(wall\) late"
)


@dataclass(slots=True)
class RowResult:
    status: str  # ok | cannot run | failed
    reason: str = ""
    tput_per_gpu: float = math.nan
    median_intvty: float = math.nan
    median_ttft_s: float = math.nan
    requests: int = 0
    speed: float = 0.0
    late_steps_pct: float = math.nan
    late_ms: float = math.nan
    preemptions: int = 0
    client_tput_per_gpu: float = math.nan
    wall_s: float = 0.0


def choose_speed(p: Point, seconds: float) -> float:
    """A clock speed-up that fits the first wave plus a few steady cycles into ``seconds`` of wall time."""
    dep = deploy(p.model, p.hardware, p.tp, KV_CACHE_DTYPE, p.precision, ep=p.ep, generation=p.generation)
    pred = point_figures(p, dep.cost)
    cycle = pred.median_ttft_s + (p.osl - 1) / pred.median_intvty
    return max(1.0, (CYCLES + 0.7) * cycle / seconds)


def measure(log: Path, users: int, gpus: int) -> tuple[float, float, float, int, int]:
    """(tput per GPU, median interactivity, median TTFT, requests, preemptions) from a request log."""
    recs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    steady = measured(
        [
            Timeline(r["arrival_s"], r["first_token_s"], r["finish_s"], r["prompt_tokens"], r["output_tokens"],
                     r["preemptions"])
            for r in recs
        ]
    )  # fmt: skip
    got = figures(steady, users, gpus)
    return (
        got.tput_per_gpu,
        got.median_intvty,
        got.median_ttft_s,
        got.requests,
        sum(r.preemptions for r in steady),
    )


def _engine_argv(p: Point, speed: float, log: Path) -> list[str]:
    return [
        sys.executable, "-m", "agentsweep.cli", "engine-sim", p.model,
        "--host", "127.0.0.1", "--port", "0", "--dialect", "sglang",
        "--hardware", p.hardware, "--tp-size", str(p.tp), "--ep-size", str(p.ep),
        "--quantization", p.precision, "--chunked-prefill-size", str(CHUNK), "--kv-cache-dtype", KV_CACHE_DTYPE,
        "--speed", f"{speed:.6g}", "--request-log", str(log),
        "--scheduler-recv-interval", str(p.recv_interval),
    ] + (["--calibration-generation", p.generation] if p.generation else [])  # fmt: skip


def _wait_url(proc: subprocess.Popen[str], lines: list[str]) -> str | None:
    deadline = time.monotonic() + START_TIMEOUT_S
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            return None
        lines.append(line.rstrip("\n"))
        m = _URL.search(line)
        if m:
            return m.group(1)
    return None


def run_row(p: Point, seconds: float, work: Path) -> RowResult:
    t0 = time.monotonic()
    speed = choose_speed(p, seconds)
    res = RowResult("failed", speed=speed)
    row_dir = Path(tempfile.mkdtemp(prefix=f"row{p.line}-", dir=work))
    traces = row_dir / "random.jsonl"
    count = p.conc * (CYCLES + 3)
    with traces.open("w") as fh:
        (in_lo, in_hi), (out_lo, out_hi) = length_bounds(p.isl), length_bounds(p.osl)
        spec_in = LengthSpec.parse(f"uniform:{in_lo}:{in_hi}", "isl")
        spec_out = LengthSpec.parse(f"uniform:{out_lo}:{out_hi}", "osl")
        for trace in synth_workload(spec_in, spec_out, count, seed=p.line):
            fh.write(json.dumps(trace, separators=(",", ":")) + "\n")
    log = row_dir / "requests_engine.jsonl"
    lines: list[str] = []
    proc = subprocess.Popen(
        _engine_argv(p, speed, log),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=die_with_parent(signal.SIGTERM),  # gone with calibrate, even after SIGKILL
    )
    try:
        url = _wait_url(proc, lines)
        if url is None:
            proc.wait(timeout=10)
            rest = proc.stdout.read() if proc.stdout else ""
            text = [ln for ln in ("\n".join(lines) + rest).splitlines() if ln.strip()]
            res.status = "cannot run" if proc.returncode == 2 else "failed"
            res.reason = (text[-1] if text else f"engine exited {proc.returncode}").strip()
            return res
        out = row_dir / "replay"
        cmd = [
            sys.executable, "-m", "kv_cache_tester.cli", "replay", "--api-endpoint", url,
            "--trace-directory", str(traces), "--output-dir", str(out), "--max-users", str(p.conc),
            "--recycle", "--test-duration", f"{seconds:g}", "--grace-period", "0", "--max-context", "0",
            "--ignore-eos", "--no-plot", "--no-color", "--progress-interval", "3600",
        ]  # fmt: skip
        rep = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=seconds + 120,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        if rep.returncode != 0:
            tail = (rep.stderr or rep.stdout).strip().splitlines()
            res.reason = f"replay exited {rep.returncode}: {tail[-1] if tail else ''}"
            return res
        try:
            tput = load_summary(out)["throughput"]["total_tok_per_s"]
        except ResultError:
            tput = None
        if tput is not None:
            res.client_tput_per_gpu = tput / speed / p.tp
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rest, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
        lines.extend((rest or "").splitlines())
    m = next((m for m in map(_LATE.search, lines) if m), None)
    if m:
        res.late_steps_pct, res.late_ms = float(m.group(1)), float(m.group(3))
    tput, intv, ttft, n, pre = measure(log, p.conc, p.tp)
    res.tput_per_gpu, res.median_intvty, res.median_ttft_s, res.requests, res.preemptions = (
        tput,
        intv,
        ttft,
        n,
        pre,
    )
    res.status = "ok" if n and math.isfinite(tput) else "failed"
    if res.status != "ok":
        res.reason = "no request finished after the first wave"
    res.wall_s = time.monotonic() - t0
    return res
