"""The KV-capacity cliff: is the users' live context larger than the engine's GPU KV pool?

Past it, a session's prefix is evicted before its next turn comes back, so the GPU hit rate collapses
while the traces' theoretical reuse stays high, and TTFT jumps (every turn recomputes its context).

- The pool comes from the engine's own start-up log (``agentsweep.contract.resultdir.serverlog``) (the head of server.log, which trimming keeps):
  vLLM's ``GPU KV cache size: N tokens`` (the simulated engine prints the same line), SGLang's
  ``KV Cache is allocated. #tokens: N``.
- The working set comes from the records: for each lane, the largest context (prompt + output
  tokens) one of its requests held in the profiling window; summed over lanes.
"""

from __future__ import annotations

from agentsweep.contract.figures import Figures


def cliff_columns(working_set: int | None, pool: int | None) -> Figures:
    return {
        "kv_working_set_tokens": working_set,
        "kv_pool_tokens": pool,
        "past_kv_cliff": None if working_set is None or pool is None else working_set > pool,
    }
