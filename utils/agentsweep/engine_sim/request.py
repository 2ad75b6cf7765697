"""One request inside the simulated engine: its state, its blocks and its timeline in simulated time.

The timeline (``SimRequest.timeline``) is what the engine states about a finished request in its own
clock, so a simulated cell can report latencies without the HTTP path's wall time multiplied by the
speed-up: it ends the response (``sim_timeline`` on the last SSE chunk, or in the body) and is the
line ``--request-log`` writes. docs/engine-sim.md lists its fields.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from kv_cache_tester.replay.results import itl_summary

from agentsweep.engine_sim.kv_cache import Node

WAITING, LOADING, RUNNING, FINISHED = "waiting", "loading", "running", "finished"


@dataclass(slots=True, eq=False)
class SimRequest:
    rid: str
    tokens_len: int
    hashes: list[int]  # chained hashes of the prompt's full blocks
    max_tokens: int
    arrival: float
    status: str = WAITING
    prefill_len: int = 0  # tokens to compute before decoding (prompt, or prompt + output after preemption)
    computed: int = 0
    generated: int = 0
    held: int = 0  # GPU blocks held: the cached path below, then private blocks
    node: Node | None = None  # the deepest cached run this request holds (the path ends there)
    depth: int = 0  # cached blocks on that path
    registered: int = 0  # prompt blocks already considered for caching
    ready_at: float = 0.0
    cached_tokens: int = -1  # prefix hits at first admission (usage.prompt_tokens_details)
    gpu_hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float = 0.0
    finished_at: float | None = None
    counted_prompt: bool = False
    preemptions: int = 0
    aborted: bool = False
    finish_reason: str = "length"
    event: asyncio.Event = field(default_factory=asyncio.Event)
    request_id: str | None = None  # the client's X-Request-ID, for joining the request log
    # A streamed response's writer (``sse.SseStream.push``): while set, new tokens are pushed to it
    # when the engine's loop yields instead of waking ``event``; ``dirty``: it has tokens to push.
    sink: Callable[[], None] | None = None
    dirty: bool = False
    itls: list[float] = field(default_factory=list)  # the gaps the ITL histogram observed for it
    # Disaggregated serving (``disagg.py``). A decode's ``remote`` prompt arrives over the fabric instead
    # of being computed: ``remote_tokens`` of it were transferred. A prefill's ``pin`` keeps its blocks
    # held after it finishes, until the decode has taken them (``KVTransfer.release``).
    remote: bool = False
    remote_tokens: int = 0
    pin: bool = False
    pinned: bool = False
    on_loaded: Callable[[], None] | None = None  # called once its transferred blocks are resident
    transfer_s: float = 0.0  # decode: the modelled KV transfer (simulated s)
    prefill_s: float = 0.0  # decode: the prefill instance's own arrival -> first token for this prompt

    def timeline(self, clock: str) -> str:
        """The finished request's timeline as a JSON object; ``clock`` ends it (the engine's speed and
        the Unix time its clock started, ``Engine.clock_fields``)."""
        first = self.first_token_at
        finish = self.finished_at if self.finished_at is not None else self.last_token_at
        base = self.arrival - self.prefill_s  # the prefill's time counts as this request's
        n = self.generated
        ttft = "null" if first is None else repr(first - base)
        tpot = "null" if first is None or n < 2 else repr((finish - first) / (n - 1))
        itl = itl_summary(self.itls)
        return (
            f'{{"arrival_s":{self.arrival!r},"first_token_s":{_num(first)},"finish_s":{finish!r},'
            f'"ttft_s":{ttft},"e2e_s":{finish - base!r},"tpot_s":{tpot},'
            f'"itl_s":{{"mean":{_num(itl["mean"])},"p50":{_num(itl["p50"])},"p99":{_num(itl["p99"])},'
            f'"max":{_num(itl["max"])},"n":{itl["n"]}}},"output_tokens":{n},"prefill_s":{self.prefill_s!r},'
            f'"transfer_s":{self.transfer_s!r},"preemptions":{self.preemptions}{clock}}}'
        )

    def log_line(self, clock: str) -> str:
        """The ``--request-log`` line: the request id, its prompt and cached tokens, and the timeline."""
        rid = "null" if self.request_id is None else json.dumps(self.request_id)
        return (
            f'{{"request_id":{rid},"prompt_tokens":{self.tokens_len},'
            f'"cached_tokens":{max(self.cached_tokens, 0)},{self.timeline(clock)[1:]}\n'
        )


def _num(value: float | None) -> str:
    return "null" if value is None else repr(value)
