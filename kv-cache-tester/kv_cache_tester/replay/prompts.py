"""Request bodies, pre-encoded as bytes, from the trace library's synthesizer; plus theoretical hits.

Prompt modes (``PromptSynthesizer``): ``words`` (default: one word per token, for the simulated
engine), ``chat`` (``--tokenizer``: words calibrated to the served model's tokenizer) and ``ids``
(``--api completions``: token ids). Token ids always come from the served model's vocabulary: the
tokenizer's single-token words with ``--tokenizer``, else ids below the vocabulary size the server
reported (``ids_for_vocab``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat, takewhile
from typing import Any

from kv_cache_tester.errors import UsageError
from kv_cache_tester.replay.jsonfast import dumps
from kv_cache_tester.traces.model import Request, SubAgent, Trace
from kv_cache_tester.traces.synth import (
    IDS_BASE,
    IDS_RANGE,
    PlaySynth,
    PromptSynthesizer,
    _Vocab,
    common_prefix,
)

MIN_ID_CHOICES = 256  # fewer distinct ids and unrelated blocks would too often share content


def ids_for_vocab(vocab_size: int) -> range:
    """The token ids drawn for a model of ``vocab_size`` ids when no tokenizer is given.

    ``[1000, 1000 + 16384)`` cut to the vocabulary, keeping clear of its low ids (bytes, control
    tokens) and of its top (where many models keep their special tokens): at most ``[v/4, v - r)``
    with ``r = min(256, v/16)``.
    """
    lo = min(IDS_BASE, vocab_size // 4)
    hi = min(IDS_BASE + IDS_RANGE, vocab_size - min(256, vocab_size // 16))
    if hi - lo < MIN_ID_CHOICES:
        raise UsageError(
            f"--api completions: a vocabulary of {vocab_size} ids leaves too few ids to draw prompts from; "
            "pass --tokenizer"
        )
    return range(lo, hi)


@dataclass(slots=True)
class Scope:
    """One play of one trace (sub-agents share it)."""

    play: PlaySynth
    salt: str
    cache_scope: str
    local: bool
    closed: bool = False
    # Per owner (the parent "", or a sub-agent's id): its whole blocks' text (or ids) as last seen,
    # and their JSON encoding without its closing quote (or bracket). The blocks are most of every
    # prompt and change only when a request adds to them: they are encoded once.
    stems: dict[str, tuple[Any, bytes]] = field(default_factory=dict)


@dataclass(slots=True)
class Built:
    body: bytes
    expected_prompt_tokens: int
    total_blocks: int


def salt_for(trace: Trace, play: int) -> str:
    """First play: no salt (content matches the trace analysis). A replayed trace gets fresh content
    so it cannot hit its own earlier play in the server cache. Global-scope datasets keep one salt
    for the run, or their intended cross-trace sharing would be lost."""
    if play == 0 or trace.hash_id_scope == "global":
        return ""
    return f"p{play}"


class DeliveredBlocks:
    """An infinite prefix cache per scope that holds only what the server accepted.

    Each block remembers the earliest dispatch ticket of an accepted request that carried it. A
    request's hits are its leading blocks carried by a request sent before it, whenever that one was
    accepted (an engine caches a request's blocks once it schedules it, so a request sent just after
    a sibling finds the sibling's blocks): the count is taken when the request has finished.
    """

    def __init__(self) -> None:
        self._first: dict[str, dict[int, int]] = {}
        # Per scope, the blocks and tickets of the last two requests added: each such block is held
        # with that ticket or an earlier one (a block's ticket only ever goes down). A request that
        # shares their prefix (the usual next turn) skips it in both passes below. Two: a request's
        # hits are counted after its own blocks were added, against the request before it.
        self._last: dict[str, list[tuple[Sequence[int], int]]] = {}
        self._next = 0

    def ticket(self) -> int:
        self._next += 1
        return self._next

    # Both run once per request over its blocks (hundreds): past the prefix they skip, they are
    # chains of C-level iterators, with no Python step per block.
    def add(self, hash_ids: Sequence[int], scope: str, ticket: int) -> None:
        """Each block keeps the earlier of its ticket and ``ticket``."""
        first = self._first.setdefault(scope, {})
        skip = self._known(hash_ids, scope, ticket + 1)
        rest = hash_ids[skip:]
        # The leading blocks already held with an earlier ticket (usually all but the new ones) stay.
        held = len(list(takewhile(ticket.__ge__, map(first.get, rest, repeat(ticket + 1)))))
        if held < len(rest):
            rest = rest[held:]
            first.update(
                zip(rest, map(min, map(first.get, rest, repeat(ticket)), repeat(ticket)), strict=True)
            )
        recent = self._last.setdefault(scope, [])
        recent.insert(0, (hash_ids, ticket))
        del recent[2:]

    def hits(self, hash_ids: Sequence[int], scope: str, ticket: int) -> int:
        """The leading blocks held with a ticket below ``ticket``."""
        first = self._first.get(scope)
        if not first:
            return 0
        skip = self._known(hash_ids, scope, ticket)
        rest = hash_ids[skip:] if skip else hash_ids
        return skip + len(list(takewhile(ticket.__gt__, map(first.get, rest, repeat(ticket)))))

    def _known(self, hash_ids: Sequence[int], scope: str, below: int) -> int:
        """Leading blocks surely held with a ticket below ``below``: those shared with the latest
        of the last two requests added whose ticket is below it."""
        for ids, ticket in self._last.get(scope, ()):
            if ticket < below:
                return common_prefix(ids, hash_ids)
        return 0

    def forget(self, scope: str) -> None:
        self._first.pop(scope, None)
        self._last.pop(scope, None)


class PayloadBuilder:
    def __init__(
        self,
        *,
        api: str,
        model: str,
        seed: int,
        ignore_eos: bool,
        send_max_tokens: bool,
        mode: str = "words",
        tokenizer: Any = None,
        vocab_size: int | None = None,
    ) -> None:
        self.api = api
        self.mode = mode
        self.synth = PromptSynthesizer(mode=mode, seed=seed, tokenizer=tokenizer)  # type: ignore[arg-type]
        if mode == "ids" and tokenizer is None:
            if vocab_size is None:
                raise UsageError(
                    "--api completions: the served model's vocabulary is unknown; pass --tokenizer"
                )
            self.synth.vocab = _Vocab(list(ids_for_vocab(vocab_size)), "")
        self.reference = DeliveredBlocks()
        self._head = b'{"model":' + dumps(model)
        self._tail_fixed = b',"stream":true,"stream_options":{"include_usage":true}' + (
            b',"ignore_eos":true' if ignore_eos else b""
        )
        self._send_max_tokens = send_max_tokens

    def open_scope(self, trace: Trace, play: int) -> Scope:
        salt = salt_for(trace, play)
        ps = self.synth.start_play(trace, salt)
        return Scope(play=ps, salt=salt, cache_scope=ps.cache_scope, local=trace.hash_id_scope != "global")

    def close_scope(self, scope: Scope) -> None:
        """Forget a finished play's blocks (bounded memory); global scopes live for the run."""
        scope.closed = True
        if scope.local:
            self.reference.forget(scope.cache_scope)

    # The infinite-cache reference follows what the server really got (docs/traces.md, "Theoretical
    # hit rate of a replay").
    def dispatched(self) -> int:
        """A ticket for a request about to be sent (its place in the dispatch order)."""
        return self.reference.ticket()

    def delivered(self, scope: Scope, req: Request, ticket: int) -> None:
        """The server took ``req``: its blocks are cached for every request sent after it."""
        if not scope.closed or not scope.local:
            self.reference.add(req.hash_ids, scope.cache_scope, ticket)

    def hits(self, scope: Scope, req: Request, ticket: int) -> int:
        """Leading blocks of ``req`` that requests sent before it, and taken by the server, hold."""
        return self.reference.hits(req.hash_ids, scope.cache_scope, ticket)

    def build(self, scope: Scope, agent: SubAgent | None, req: Request, one_token: bool = False) -> Built:
        """The request's body; ``one_token``: a warm-up request that asks for one output token."""
        stem, rest = scope.play.parts(req, agent)
        owner = "" if agent is None else agent.agent_id
        kept = scope.stems.get(owner)
        if kept is None or kept[0] is not stem:
            kept = scope.stems[owner] = (stem, dumps(stem)[:-1])
        # The prompt's JSON: the stem's without its end, then the rest's without its start (JSON
        # escapes each character alone, so the two join into the encoding of the whole).
        encoded = [kept[1], dumps(rest)[1:]]
        if self.mode == "ids" and stem and rest:
            encoded.insert(1, b",")
        if self.api == "chat":
            parts = [self._head, b',"messages":[{"role":"user","content":', *encoded, b"}]"]
        else:
            parts = [self._head, b',"prompt":', *encoded]
        parts.append(self._tail_fixed)
        if one_token:
            parts.append(b',"max_tokens":1')
        elif self._send_max_tokens:
            parts.append(b',"max_tokens":%d' % max(1, req.out_tokens))
        parts.append(b"}")
        body = b"".join(parts)  # one copy of the (often 100+ KB) prompt, not one per concatenation
        return Built(body, req.in_tokens, len(req.hash_ids))
