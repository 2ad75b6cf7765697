"""Prompt -> token count and chained block hashes, reusing the work done for the prompt it extends.

Agentic prompts grow turn by turn, so almost all of a prompt was tokenized and hashed for the same
session's previous request. Tokenizing and hashing a 20k-token prompt from scratch costs about as
much CPU as everything else the simulator does for a request, so it is done once per session and
extended afterwards.

A prompt is a list of segments, each ``(template ids, text or token ids)``: one segment per chat
message (role and separator ids, then the content), or a single segment for a completions prompt.
Its "core" is the concatenation of the segments; ``closing`` ids (the chat template's end and
generation marker) follow the core but are not remembered, since the next turn replaces them.

An earlier prompt is reused only when the new one provably extends it: identical leading segments,
and a last segment whose text the new one continues at a word boundary (or whose ids it continues),
so the result always equals tokenizing and hashing the whole prompt. Entries are found by the
client's session id when it sends one (X-Session-ID), else by the start of the prompt. Memory is
bounded by ``max_bytes`` of remembered text and ids (LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentsweep.engine_sim.kv_cache import block_hashes
from agentsweep.engine_sim.tokenizer import encode_array, segment_array

Content = str | list[int]
_EMPTY = np.empty(0, dtype=np.uint64)
Segment = tuple[tuple[int, ...], Content]


@dataclass(slots=True)
class PromptBlocks:
    length: int  # prompt tokens
    hashes: list[int]  # chained hashes of the prompt's full blocks (empty without prefix caching)


@dataclass(slots=True)
class _Entry:
    segments: list[Segment]
    length: int  # core tokens
    hashes: list[int]  # full blocks of the core; never mutated once stored
    tail: np.ndarray  # core tokens after the last full block
    size: int  # bytes charged against the memo's budget


def _continuation(old: list[Segment], new: Sequence[Segment]) -> np.ndarray | None:
    """The ids ``new``'s core adds to ``old``'s core, or None when it does not extend it."""
    k = len(old)
    if not k or len(new) < k or list(new[: k - 1]) != old[: k - 1]:
        return None
    old_prefix, old_content = old[-1]
    new_prefix, new_content = new[k - 1]
    if old_prefix != new_prefix:
        return None
    if isinstance(old_content, str):
        if not isinstance(new_content, str) or not new_content.startswith(old_content):
            return None
        n = len(old_content)
        if 0 < n < len(new_content) and not (new_content[n].isspace() or old_content[-1].isspace()):
            return None  # the old text ends inside a word of the new one
        cont = encode_array(new_content[n:]) if n < len(new_content) else _EMPTY
    else:
        n = len(old_content)
        if not isinstance(new_content, list) or len(new_content) < n or new_content[:n] != old_content:
            return None
        cont = np.asarray(new_content[n:], dtype=np.uint64)
    if len(new) > k:
        cont = np.concatenate([cont, segment_array(new[k:])])
    return cont


def _size(segments: Sequence[Segment], hashes: list[int]) -> int:
    return 8 * len(hashes) + sum(len(c) if isinstance(c, str) else 8 * len(c) for _, c in segments)


class PromptMemo:
    KEY_CHARS = 512

    def __init__(self, block_size: int, hashing: bool = True, max_bytes: int = 256 << 20) -> None:
        self.block_size = block_size
        self.hashing = hashing
        self.max_bytes = max_bytes
        self._entries: OrderedDict[object, _Entry] = OrderedDict()
        self._bytes = 0
        self.prompts = 0
        self.reused = 0  # prompts that extended a remembered one

    def _chain(self, tokens: np.ndarray, parent: list[int]) -> list[int]:
        """Hashes of the full blocks of ``tokens``, chained on after ``parent``'s last one."""
        if not self.hashing:
            return []
        return block_hashes(tokens, self.block_size, parent[-1] if parent else 0)

    def blocks(
        self, segments: Sequence[Segment], closing: Sequence[int] = (), session: str | None = None
    ) -> PromptBlocks:
        key: object = session
        if key is None:
            first = segments[0][1] if segments else ""
            key = first[: self.KEY_CHARS] if isinstance(first, str) else tuple(first[:64])
        bs = self.block_size
        self.prompts += 1
        old = self._entries.pop(key, None)
        cont = None
        if old is not None:
            self._bytes -= old.size
            cont = _continuation(old.segments, segments)
        if old is None or cont is None:
            core = segment_array(segments)
            length = len(core)
            hashes = block_hashes(core, bs) if self.hashing else []
            tail = core[len(hashes) * bs :].copy() if self.hashing else _EMPTY  # not a view of core
        else:
            self.reused += 1
            work = np.concatenate([old.tail, cont]) if len(old.tail) else cont
            new = self._chain(work, old.hashes)
            hashes = old.hashes + new if new else old.hashes
            length = old.length + len(cont)
            tail = work[len(new) * bs :].copy() if self.hashing else _EMPTY
        entry = _Entry(list(segments), length, hashes, tail, _size(segments, hashes))
        if entry.size <= self.max_bytes:
            self._entries[key] = entry
            self._bytes += entry.size
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.size
        if closing:
            extra = self._chain(np.concatenate([tail, np.asarray(closing, dtype=np.uint64)]), hashes)
            if extra:
                hashes = hashes + extra
        return PromptBlocks(length + len(closing), hashes)
