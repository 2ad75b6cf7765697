"""--workers N: spread the lanes over N processes (past one core).

Lane i runs in worker i % N (of this client's lanes), trace j belongs to worker j % N (so a trace is never live in two
lanes, even across processes). Every worker builds its first requests, says it is ready, and all
start at one common instant on the system-wide monotonic clock. Workers append to the same
requests.jsonl (one write per line on an O_APPEND descriptor), send progress snapshots and, at
the end, their RunMeta to this process, which prints the progress line and writes the summary.

Signals: workers ignore SIGINT; this process turns the first SIGINT/SIGTERM into a SIGTERM to each
worker (stop dispatching, grace period) and a second one into another (abandon requests in flight).
A worker whose circuit breaker trips sets a shared event that stops the others.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import signal
import time
from pathlib import Path
from typing import Any

from kv_cache_tester.errors import RunAborted
from kv_cache_tester.replay.config import ReplayConfig
from kv_cache_tester.replay.loop import Replayer
from kv_cache_tester.replay.pool import TracePool
from kv_cache_tester.replay.process import make_builder, run_loop
from kv_cache_tester.replay.progress import Progress
from kv_cache_tester.replay.recorder import Recorder
from kv_cache_tester.replay.summary import RunMeta
from kv_cache_tester.traces.model import Trace

START_SLACK_S = 0.05  # between "all ready" and the common start
READY_TIMEOUT_S = 600.0


def _worker_main(
    cfg: ReplayConfig,
    traces: list[Trace],
    lanes: list[int],
    out: str,
    model: str,
    index: int,
    q: Any,
    go: Any,
    t0: Any,
    stop_all: Any,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> RunMeta:
        loop = asyncio.get_running_loop()
        recorder = Recorder(Path(out), cfg.debug_trace)

        async def gate() -> float:
            q.put(("ready", index, None))
            await loop.run_in_executor(None, go.wait)
            start = float(t0.value)
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            return start

        pool = TracePool(list(range(len(traces))), cfg.seed, cfg.recycle)
        replayer = Replayer(cfg, traces, lanes, pool, make_builder(cfg, model), recorder, start_gate=gate)
        loop.add_signal_handler(signal.SIGTERM, replayer.on_signal, signal.SIGTERM)

        async def tick() -> None:
            last = 0.0
            while True:
                await asyncio.sleep(0.2)
                if stop_all.is_set() and not replayer.stopping:
                    replayer.stop("peer")
                if replayer.breaker.tripped:
                    stop_all.set()
                now = time.perf_counter()
                if replayer.t0 and now - last >= cfg.progress_interval:
                    last = now
                    q.put(("snap", index, replayer.snapshot()))

        ticker = loop.create_task(tick())
        try:
            return await replayer.run()
        finally:
            ticker.cancel()
            recorder.close()

    try:
        meta = run_loop(main)
    except BaseException as err:  # report, never hang the parent
        q.put(("error", index, f"{type(err).__name__}: {err}"))
        raise
    q.put(("meta", index, meta))


def run_workers(
    cfg: ReplayConfig, traces: list[Trace], out: Path, model: str, noted: list[int] | None = None
) -> list[RunMeta]:
    n = cfg.workers
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    go = ctx.Event()
    stop_all = ctx.Event()
    t0 = ctx.Value("d", 0.0)
    procs = []
    for w in range(n):
        share = [t for j, t in enumerate(traces) if j % n == w]
        lanes = cfg.lanes[w::n]
        p = ctx.Process(
            target=_worker_main,
            args=(cfg, share, lanes, str(out), model, w, q, go, t0, stop_all),
            name=f"replay-worker-{w}",
        )
        p.start()
        procs.append(p)

    signals = 0

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal signals
        signals += 1
        for p in procs:
            if p.is_alive() and p.pid is not None:
                p.terminate()  # SIGTERM: first one stops dispatching, second abandons in flight

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    for signum in noted or ():  # arrived while the output files were made and the workers started
        on_signal(signum, None)
    progress = Progress(cfg.users, cfg.test_duration, color=not cfg.no_color, max_ttft=cfg.max_ttft)
    metas: dict[int, RunMeta] = {}
    errors: list[str] = []
    snaps: dict[int, dict[str, Any]] = {}
    ready = 0
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while len(metas) + len(errors) < n:
            try:
                kind, w, payload = q.get(timeout=0.5)
            except queue.Empty:
                if not go.is_set() and time.monotonic() > deadline:
                    raise RunAborted(f"workers not ready after {READY_TIMEOUT_S:.0f} s") from None
                dead = [p for i, p in enumerate(procs) if not p.is_alive() and i not in metas]
                if dead and q.empty():
                    time.sleep(0.5)
                    if q.empty():
                        errors.append(f"worker {dead[0].name} exited with status {dead[0].exitcode}")
                        break
                continue
            if kind == "ready":
                ready += 1
                if ready == n:
                    wait = START_SLACK_S if cfg.start_at is None else cfg.start_at - time.time()
                    t0.value = time.perf_counter() + max(START_SLACK_S, wait)
                    go.set()
            elif kind == "snap":
                snaps[w] = payload
                if go.is_set():
                    merged = {
                        "active": sum(s["active"] for s in snaps.values()),
                        "in_flight": sum(s["in_flight"] for s in snaps.values()),
                        "done": sum(s["done"] for s in snaps.values()),
                        "failed": sum(s["failed"] for s in snaps.values()),
                        "tokens": sum(s["tokens"] for s in snaps.values()),
                        "out_tokens": sum(s["out_tokens"] for s in snaps.values()),
                        "ttft_p50": max(
                            (s["ttft_p50"] for s in snaps.values() if s["ttft_p50"]), default=None
                        ),
                    }
                    progress.update(time.perf_counter() - t0.value, merged)
            elif kind == "meta":
                metas[w] = payload
            elif kind == "error":
                errors.append(f"worker {w}: {payload}")
    finally:
        progress.close()
        for p in procs:
            p.join(timeout=cfg.grace_period + 30)
            if p.is_alive():
                p.kill()
                p.join()
        for s, h in old.items():
            signal.signal(s, h)
    if errors and not metas:
        raise RunAborted("; ".join(errors))
    ordered = [metas[w] for w in sorted(metas)]
    ordered[0].errors.extend(errors)  # a worker that died fails the run too (reported by finish)
    return ordered
