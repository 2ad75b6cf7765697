"""server.log read back: the engine's GPU KV pool as its start-up log states it.

vLLM's ``GPU KV cache size: N tokens`` (the simulated engine prints the same line), SGLang's ``KV Cache
is allocated. #tokens: N``; both near the top of the log, which trimming keeps. Read here, in the
result-directory layer, so that collect and the capacity search take it from one reader.
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
