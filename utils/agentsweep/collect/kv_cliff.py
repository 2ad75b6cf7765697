"""The KV-capacity cliff: is the users' live context larger than the engine's GPU KV pool?

Past it, a session's prefix is evicted before its next turn comes back, so the GPU hit rate collapses
while the traces' theoretical reuse stays high, and TTFT jumps (every turn recomputes its context).

- The pool comes from the engine's own start-up log (the head of server.log, which trimming keeps):
  vLLM's ``GPU KV cache size: N tokens`` (the simulated engine prints the same line), SGLang's
  ``KV Cache is allocated. #tokens: N``.
- The working set comes from the records: for each lane, the largest context (prompt + output
  tokens) one of its requests held in the profiling window; summed over lanes.
"""

from __future__ import annotations

import re
from pathlib import Path

from kv_cache_tester.inputfiles import InputFileProblem, open_regular

_POOL = (
    re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens"),
    re.compile(r"KV Cache is allocated\.\s*#tokens:\s*([\d,]+)"),
)
HEAD_BYTES = 256 << 10  # the start-up lines are near the top of the log


def kv_pool_tokens(server_log: Path) -> int | None:
    """The engine's GPU KV pool in tokens as its start-up log states it; None when not found."""
    try:
        with open_regular(server_log, follow_links=False) as fh:
            head = fh.read(HEAD_BYTES).decode("utf-8", "replace")
    except (InputFileProblem, OSError):  # absent, a link or not a file: no pool figure
        return None
    for rx in _POOL:
        match = rx.search(head)
        if match:
            return int(match.group(1).replace(",", "")) or None
    return None


def cliff_columns(working_set: int | None, pool: int | None) -> dict[str, object]:
    return {
        "kv_working_set_tokens": working_set,
        "kv_pool_tokens": pool,
        "past_kv_cliff": None if working_set is None or pool is None else working_set > pool,
    }
