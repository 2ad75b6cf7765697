"""The replayer's memory bound: what prompt text it may hold at once, checked before anything is sent.

A play of a trace keeps, per owner (the parent and each sub-agent), the last prompt it built (the
text, its JSON encoding, the blocks it was made of) and the body in flight. So a lane holds at most
``held_tokens(trace)`` tokens of prompt for the trace it plays: the sum over owners of each owner's
longest prompt. The run holds at most ``lanes * max(held_tokens) * bytes_per_token`` bytes of
prompts, on top of what the loaded traces take (docs/replayer.md, "Memory").

Two limits make that figure finite whatever the trace and ``--max-context``:

* one prompt is at most ``MAX_PROMPT_TOKENS`` tokens (``--max-context 0`` cuts traces there;
  a larger ``--max-context`` is refused): this also bounds the time one prompt takes to build,
  during which the event loop sees neither signals nor the end of the run;
* the prompt memory of the run is at most ``--max-prompt-memory`` GiB, else the run is refused
  before it starts, in one line naming the figures.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from kv_cache_tester.errors import UsageError
from kv_cache_tester.traces.model import Trace

MAX_PROMPT_TOKENS = 4 * 1024 * 1024  # 4 Mi tokens: above every served context length; ~0.2 s to build
DEFAULT_PROMPT_MEMORY_GIB = 8.0
# Bytes held per prompt token (block cache, owner's last prompt, its JSON, the body in flight, and
# the copies made while building one), by prompt mode; measured by benchmarks/bench_memory.py with
# margin. Chat-mode words may be longer and JSON-escaped, hence the larger figure.
BYTES_PER_TOKEN = {"words": 32, "ids": 48, "chat": 64}
GIB = 1 << 30


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process (Linux /proc), else this process's peak; 0 when unknown."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        if pid != "self":
            return 0
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def held_tokens(trace: Trace) -> int:
    """Prompt tokens one play of ``trace`` may hold at once: each owner's longest prompt, summed."""
    total = max((r.in_tokens for r in trace.requests), default=0)
    for group in trace.groups:
        for agent in group.agents:
            total += max((r.in_tokens for r in agent.requests), default=0)
    return total


def prompt_memory_bytes(traces: Sequence[Trace], lanes: int, mode: str) -> int:
    """The most prompt memory ``lanes`` lanes playing ``traces`` hold at once (bytes)."""
    if not traces:
        return 0
    busiest = sorted((held_tokens(t) for t in traces), reverse=True)[:lanes]
    return sum(busiest) * BYTES_PER_TOKEN[mode]


def check_prompt_memory(traces: Sequence[Trace], lanes: int, mode: str, limit_gib: float) -> int:
    """The run's prompt memory bound in bytes; UsageError when it is over ``limit_gib``."""
    need = prompt_memory_bytes(traces, lanes, mode)
    if need > limit_gib * GIB:
        top = max(traces, key=held_tokens)
        raise UsageError(
            f"--max-prompt-memory {limit_gib:g} GiB: {lanes} users playing these traces may hold "
            f"{need / GIB:.1f} GiB of prompts (trace {top.trace_id} alone {held_tokens(top)} tokens "
            f"across its owners, {BYTES_PER_TOKEN[mode]} bytes each); lower --max-context or "
            "--max-users, or raise --max-prompt-memory"
        )
    return need
