"""The simulated engine's prefix cache driven by one finished run's own request timeline (kv-pressure).

A closed-loop comparison mixes two things: the cache's rules, and the pace that decides when each
session comes back and how long each request holds its blocks. Replaying one run's recorded timeline
through ``engine_sim``'s ``KVCache`` separates them. Each accepted request is admitted when that run's
scheduler took it (its dispatch plus the wait before the scheduler, at most its TTFT): its longest
cached prefix is a hit, the rest of its prompt takes new blocks (evicting least recently freed ones)
and is cached at once, as vLLM caches a step's full blocks when it schedules it. When the request
finished, its generated tokens' full blocks are cached too, and it lets go of everything, tail first.

On vLLM's timeline this gives what the simulator's cache would have kept under vLLM's own traffic; on
the simulator's own timeline it must give back the hit rate the simulator's server counted, which
checks the replay itself.

A prompt's blocks come from its trace request: engine block ``i`` stands for the trace's blocks
``0..i`` (the replayer writes a trace block's 64 tokens per hash id; the chat template's few tokens in
front shift where engine blocks start, not which prompts share them). An engine block past the trace
request's last full block holds this request's own tail, and its generated tokens' blocks are its own.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from agentsweep.engine_sim.kv_cache import KVCache, Node
from kv_cache_tester.replay import RequestRecord, accepted
from kv_cache_tester.traces.loaders import load_traces
from kv_cache_tester.traces.model import Request, Trace


class TraceIndex:
    """The trace requests a run's records name, loaded as the replayer loaded them."""

    def __init__(self, traces: Path, max_context: int) -> None:
        loaded = load_traces(traces, max_context=max_context, max_context_mode="truncate")
        self._traces: dict[str, Trace] = {t.trace_id: t for t in loaded.traces}
        self._ids: dict[object, int] = {}

    def request(self, rec: RequestRecord) -> Request:
        """The trace request a record played: the parent's ``turn``-th, or a sub-agent's (its session
        id is ``<trace>:<agent>``)."""
        trace = self._traces.get(str(rec["trace_id"]))
        if trace is None:
            raise KeyError(f"trace {rec['trace_id']!r} is not among the run's traces")
        session = str(rec.get("session_id") or "")
        turn = int(rec["turn"])
        if ":" not in session:
            return trace.requests[turn]
        agent_id = session.split(":", 1)[1]
        for group in trace.groups:
            for agent in group.agents:
                if agent.agent_id == agent_id:
                    return agent.requests[turn]
        raise KeyError(f"{session}: no such sub-agent in trace {trace.trace_id}")

    def _id(self, key: object) -> int:
        """A small integer per distinct block content (KVCache keys blocks by int)."""
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._ids) + 1
        return found

    def prompt_blocks(self, rec: RequestRecord, block_size: int) -> list[int]:
        """One content id per full engine block of the record's prompt (as the server counted it)."""
        req = self.request(rec)
        scope: object = (rec["trace_id"], rec.get("salt") or "")
        ids = req.hash_ids
        last_full = len(ids) - (0 if req.in_tokens % block_size == 0 else 1)  # trace blocks held whole
        out, key = [], scope
        for i in range(int(rec["prompt_tokens"]) // block_size):
            key = (key, ids[i]) if i < last_full else (key, "own", _own(rec), i)
            out.append(self._id(key))
        return out

    def own_block(self, rec: RequestRecord, i: int) -> int:
        return self._id(("generated", _own(rec), i))


def _own(rec: RequestRecord) -> tuple[object, ...]:
    return (rec.get("request_id"), rec.get("play"), rec.get("user"), rec.get("t_dispatch"))


class Replayed(NamedTuple):
    hit_rate: float | None  # hit tokens over prompt tokens; None when no request ran
    evicted_blocks: int  # cached blocks the pool gave up for new content


def replay_timeline(
    records: Sequence[RequestRecord],
    index: TraceIndex,
    pool_blocks: int,
    block_size: int,
    admit_wait_s: float,
) -> Replayed:
    """What ``KVCache`` of ``pool_blocks`` keeps of the run's accepted requests when it serves them on
    the run's own timeline (module docstring)."""
    events: list[tuple[float, int, int]] = []
    done = [
        r for r in records
        if accepted(r) and r.get("t_done") is not None and r.get("ttft_s") is not None and r.get("prompt_tokens")
    ]  # fmt: skip
    for k, rec in enumerate(done):
        admit = rec["t_dispatch"] + min(admit_wait_s, rec["ttft_s"])
        events.append((admit, 1, k))
        events.append((rec["t_done"], 0, k))  # at the same instant a free goes before an admission
    heapq.heapify(events)
    kv = KVCache(pool_blocks)
    held: dict[int, tuple[Node, int]] = {}  # admitted: its deepest cached node, its blocks without a hash
    blocks_of: dict[int, list[int]] = {}  # a waiting request's prompt blocks, worked out once
    waiting: deque[int] = deque()  # admissions the pool had no room for yet, first come first served
    hit_tokens = prompt_tokens = 0

    def admit(k: int) -> bool:
        nonlocal hit_tokens, prompt_tokens
        rec = done[k]
        prompt = int(rec["prompt_tokens"])
        blocks = blocks_of.get(k)
        if blocks is None:
            blocks = blocks_of[k] = index.prompt_blocks(rec, block_size)
        hit = kv.lookup(blocks, (prompt - 1) // block_size)
        new = -(-(prompt + 1) // block_size) - hit.gpu_blocks  # the prompt and the first token's slot
        if new > kv.available - hit.reclaim:
            return False
        node = kv.acquire(hit)
        kv.allocate(new)
        node, _ = kv.register(node, blocks[hit.gpu_blocks :])  # a copy another request cached is freed
        held[k] = (node, new - (len(blocks) - hit.gpu_blocks))
        blocks_of.pop(k, None)
        hit_tokens += hit.gpu_blocks * block_size
        prompt_tokens += prompt
        return True

    while events:
        _, kind, k = heapq.heappop(events)
        if kind == 1:
            if waiting or not admit(k):
                waiting.append(k)
            continue
        if k not in held:  # finished before the replayed pool could take it (it waited past its end)
            waiting.remove(k)
            continue
        rec = done[k]
        prompt, output = int(rec["prompt_tokens"]), int(rec.get("output_tokens") or 0)
        node, private = held.pop(k)
        grown = -(-(prompt + output) // block_size) - -(-(prompt + 1) // block_size)
        if grown > 0 and kv.allocate(grown):
            private += grown
        # the prompt's partial block, filled by generated tokens, and the generated tokens' full blocks
        own = [index.own_block(rec, i) for i in range(prompt // block_size, (prompt + output) // block_size)]
        if own:
            node, _ = kv.register(node, own)
            private -= len(own)
        kv.release(node, private)
        while waiting and admit(waiting[0]):
            waiting.popleft()
    return Replayed(hit_tokens / prompt_tokens if prompt_tokens else None, kv.evicted_blocks)
