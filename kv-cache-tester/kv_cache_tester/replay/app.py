"""One replay run: load traces, find the model, run the lanes (here or in worker processes), write
summary.json and the plot, return the exit status."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from kv_cache_tester.errors import RunAborted, UsageError, WriteFailed
from kv_cache_tester.replay.config import ReplayConfig
from kv_cache_tester.replay.loop import Replayer
from kv_cache_tester.replay.memory import MAX_PROMPT_TOKENS, check_prompt_memory, rss_bytes
from kv_cache_tester.replay.merge import write_run_metas
from kv_cache_tester.replay.pool import TracePool
from kv_cache_tester.replay.process import make_builder, run_loop
from kv_cache_tester.replay.progress import Progress
from kv_cache_tester.replay.recorder import DEBUG_FILE, Recorder
from kv_cache_tester.replay.results import REQUESTS_FILE, SUMMARY_FILE
from kv_cache_tester.replay.summary import RunMeta, build_summary, write_summary
from kv_cache_tester.replay.workers import run_workers
from kv_cache_tester.traces.loaders import LoadResult, load_traces
from kv_cache_tester.traces.model import Trace


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load(cfg: ReplayConfig, loader: Callable[..., LoadResult] = load_traces) -> list[Trace]:
    """The run's traces (``loader``: ``load_traces``, or one that keeps them for the next run in this
    process), with what the filters did logged."""
    source = cfg.trace_directory if cfg.trace_directory else f"hf:{cfg.hf_dataset}"
    if cfg.trace_directory and not Path(cfg.trace_directory).exists():
        raise UsageError(f"--trace-directory {cfg.trace_directory}: no such file or directory")
    # --max-context 0 still cuts at the replayer's prompt limit: memory and build time stay bounded.
    result = loader(
        source, max_context=cfg.max_context or MAX_PROMPT_TOKENS, max_context_mode="truncate", min_requests=1
    )
    for line in result.report.lines():
        log(f"traces: {line}")
    if not cfg.max_context and (result.report.truncated or result.report.dropped_max_context):
        log(f"traces: --max-context 0 cuts at the replayer's prompt limit of {MAX_PROMPT_TOKENS} tokens")
    if len(result.traces) < cfg.users:
        log(
            f"warning: {len(result.traces)} traces for {cfg.users} users: a trace is never live in two "
            f"lanes, so {cfg.users - len(result.traces)} lanes stay idle"
        )
    return result.traces


async def resolve_model(cfg: ReplayConfig) -> str:
    """--model, else the first model the server lists at /v1/models."""
    if cfg.model:
        return cfg.model
    url = cfg.api_endpoint + "/v1/models"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.get(url) as resp,
        ):
            if resp.status != 200:
                raise RunAborted(f"{url}: HTTP {resp.status}; pass --model to skip the lookup")
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        raise RunAborted(f"cannot reach {url}: {type(err).__name__}: {err}") from None
    try:
        return str(data["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise RunAborted(f"{url}: no model listed; pass --model") from None


async def resolve_vocab(cfg: ReplayConfig, model: str) -> int | None:
    """--api completions without --tokenizer: the model's vocabulary size, from the ``vocab_size``
    of its /v1/models entry. A server that gives none is refused (UsageError): ids drawn blindly
    could fall outside the vocabulary and fail every request. None when not needed."""
    if cfg.api != "completions" or cfg.tokenizer:
        return None
    url = cfg.api_endpoint + "/v1/models"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.get(url) as resp,
        ):
            data = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        raise RunAborted(f"cannot reach {url}: {type(err).__name__}: {err}") from None
    entries = data.get("data") if isinstance(data, dict) else None
    entries = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    entry = next((e for e in entries if e.get("id") == model), entries[0] if len(entries) == 1 else None)
    size = entry.get("vocab_size") if entry is not None else None
    if type(size) is not int or size <= 0:
        raise UsageError(
            f"--api completions: {url} does not give the vocabulary size of model {model!r}, so token "
            "ids could fall outside it; pass --tokenizer with the served model's tokenizer"
        )
    return size


class NotedSignals:
    """SIGINT/SIGTERM noted, not acted on by the default action, from the moment the output files exist
    until the run's own handlers take over (and again while the summary is written): a cell that stops
    as its replay starts or ends still gets whole files and a summary. The run takes ``seen`` as its
    first signals."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.seen: list[int] = []
        self._old: dict[int, Any] = {}

    def _note(self, signum: int, frame: object) -> None:
        self.seen.append(signum)

    def hold(self) -> None:
        for sig in self.SIGNALS:
            signal.signal(sig, self._note)

    def __enter__(self) -> NotedSignals:
        self._old = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
        self.hold()
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def prepare_output(cfg: ReplayConfig) -> Path:
    out = Path(cfg.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--output-dir {out}: {err.strerror or err}") from None
    for name in (REQUESTS_FILE, DEBUG_FILE, SUMMARY_FILE):
        (out / name).unlink(missing_ok=True)
    (out / REQUESTS_FILE).touch()
    return out


def pool_for(cfg: ReplayConfig, n_traces: int, worker: int = 0, workers: int = 1) -> TracePool:
    """This process's share of the traces (disjoint across workers, so a trace is never live twice)."""
    return TracePool([i for i in range(n_traces) if i % workers == worker], cfg.seed, cfg.recycle)


def lanes_for(cfg: ReplayConfig, worker: int = 0, workers: int = 1) -> list[int]:
    return cfg.lanes[worker::workers]


def client_share(cfg: ReplayConfig, traces: list[Trace]) -> list[Trace]:
    """This client process's traces: j % client_count == client_index (all of them for one client), so
    that no trace is live in two client processes of one run."""
    if cfg.client_count == 1:
        return traces
    return [t for j, t in enumerate(traces) if j % cfg.client_count == cfg.client_index]


async def start_at(when: float) -> float:
    """Wait for the Unix time ``when`` (the run's common start instant); the monotonic clock then."""
    late = time.time() - when
    if late > 0:
        log(f"warning: ready {late:.2f} s after --start-at: this client's lanes start late")
    else:
        await asyncio.sleep(-late)
    return time.perf_counter()


async def _single(
    cfg: ReplayConfig, traces: list[Trace], out: Path, model: str, noted: list[int] | None = None
) -> RunMeta:
    """One process's run. ``noted``: the signals ``NotedSignals`` held since the output files were made
    (it holds them until the loop's own handlers below take over), handed to the replayer first."""
    recorder = Recorder(out, cfg.debug_trace)
    when = cfg.start_at
    replayer = Replayer(
        cfg,
        traces,
        lanes_for(cfg),
        pool_for(cfg, len(traces)),
        make_builder(cfg, model),
        recorder,
        start_gate=(lambda: start_at(when)) if when is not None else None,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, replayer.on_signal, sig)
    for signum in noted or ():
        replayer.on_signal(signum)
    progress = Progress(cfg.users, cfg.test_duration, color=not cfg.no_color, max_ttft=cfg.max_ttft)

    async def tick() -> None:
        while True:
            await asyncio.sleep(cfg.progress_interval)
            if replayer.t0:
                progress.update(time.perf_counter() - replayer.t0, replayer.snapshot())

    ticker = loop.create_task(tick())
    try:
        return await replayer.run()
    finally:
        ticker.cancel()
        progress.close()
        recorder.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def finish(cfg: ReplayConfig, out: Path, metas: list[RunMeta], options: dict[str, Any]) -> int:
    summary = build_summary(
        out / REQUESTS_FILE,
        metas,
        users=cfg.users,
        options=options,
        slo_ttft=cfg.slo_ttft,
        slo_tpot=cfg.slo_tpot,
        stability_subwindow_s=cfg.stability_subwindow,
    )
    try:
        write_summary(out, summary)
    except OSError as err:  # a full disk: the records stay whole in requests.jsonl; say what stopped the run
        for error in (e for m in metas for e in m.errors):
            log(f"error: {error}")
        raise WriteFailed(out / SUMMARY_FILE, err) from None
    if cfg.plot:
        from kv_cache_tester.replay.plots import write_plot

        note = write_plot(out)
        if note:
            log(note)
    c, th, lat = summary["counts"], summary["throughput"], summary["latency"]
    p50 = lat["ttft_s"]["p50"]
    rps = th["requests_per_s"]
    log(
        f"done: {c['ok']} ok, {c['failed']} failed, {c['warmup']} warmup in {summary['window']['duration_s']:.1f} s"
        f" | {rps or 0:.1f} req/s | p50 TTFT {(p50 or 0) * 1000:.1f} ms | results in {out}"
    )
    recorded = c["ok"] + c["failed"] + c["warmup"]
    where = f"{recorded} requests recorded in {out}"
    errors = [e for m in metas for e in m.errors]
    for extra in errors[1:]:
        log(f"error: {extra}")
    if errors:
        raise RunAborted(f"{errors[0]}; {where}")
    breakers = [m.breaker for m in metas if m.breaker]
    if breakers:
        raise RunAborted(f"{breakers[0]}; {where}")
    signums = [m.signum for m in metas if m.signum]
    if signums:
        if not recorded:
            log(f"stopped by signal {signums[0]} before any request was sent")
        return 128 + signums[0]
    if not recorded:
        reason = ",".join(sorted({m.reason for m in metas}))
        raise RunAborted(
            f"no request was sent (stop reason: {reason}, after {summary['window']['duration_s']:.1f} s)"
        )
    unsent = sum(m.planned - m.sent for m in metas)
    if unsent and all(m.reason == "exhausted" for m in metas):
        raise RunAborted(f"{unsent} requests of the traces played were never sent; {where}")
    return 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f}"


def replay(cfg: ReplayConfig, options: dict[str, Any]) -> int:
    traces = load(cfg)
    bound = check_prompt_memory(traces, cfg.users, cfg.prompt_mode, cfg.max_prompt_memory)
    log(
        f"memory: {_mib(rss_bytes())} MiB after loading the traces; prompts held at most "
        f"{_mib(bound)} MiB (--max-prompt-memory {cfg.max_prompt_memory:g} GiB)"
    )
    model = run_loop(lambda: resolve_model(cfg))
    vocab = run_loop(lambda: resolve_vocab(cfg, model))
    if vocab is not None:
        cfg = dataclasses.replace(cfg, vocab_size=vocab)
        log(f"token ids: below the model's vocabulary of {vocab} ids (from /v1/models)")
    with NotedSignals() as noted:
        out = prepare_output(cfg)
        traces = client_share(cfg, traces)
        if cfg.workers > 1:
            metas = run_workers(cfg, traces, out, model, noted.seen)
        else:
            metas = [run_loop(lambda: _single(cfg, traces, out, model, noted.seen))]
        noted.hold()  # a signal while the summary is written: it is being written already
        options = {**options, "resolved_model": model}
        if cfg.client_count > 1:  # one of several: what merge needs besides the records
            write_run_metas(out, cfg.client_index, metas)
        with contextlib.suppress(BrokenPipeError):
            return finish(cfg, out, metas, options)
        return 1
