"""One request inside the simulated engine: its state, its blocks and its timeline in simulated time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

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
    # Disaggregated serving (``disagg.py``). A decode's ``remote`` prompt arrives over the fabric instead
    # of being computed: ``remote_tokens`` of it were transferred. A prefill's ``pin`` keeps its blocks
    # held after it finishes, until the decode has taken them (``KVTransfer.release``).
    remote: bool = False
    remote_tokens: int = 0
    pin: bool = False
    pinned: bool = False
    on_loaded: Callable[[], None] | None = None  # called once its transferred blocks are resident
