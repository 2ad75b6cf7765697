"""Deterministic prompt synthesis from hash ids: same (seed, salt, scope, hash_id) -> same block content.

API
---
::

    synth = PromptSynthesizer(mode="words", seed=0, tokenizer=None, shared_prefix=False,
                              split_system=False)
    play = synth.start_play(trace, salt)        # one per play of a trace; warmup uses the same play
    p = play.prompt(request, agent)             # agent: the request's SubAgent, or None for the parent
    p.text / p.token_ids / p.system / p.prompt_text / p.expected_prompt_tokens
    play.cache_scope                            # scope key for PrefixTracker (includes the salt)

Modes:

* ``"words"``: text of words from a fixed 256-word vocabulary, one word = one token for the
  simulated engine (which counts whitespace-separated words). Words are separated by single spaces;
  a block is exactly ``block_size`` words. ``expected_prompt_tokens == request.in_tokens``.
* ``"chat"``: text from a vocabulary calibrated on the served model's tokenizer (``tokenizer`` = a
  ``tokenizers.Tokenizer``, a path to ``tokenizer.json`` or its folder, or a Hugging Face model id read
  from the HF cache). Every word is one token with its leading space (``" word"``), so a block is
  exactly ``block_size`` tokens and blocks never merge across boundaries; the text starts with a space.
  The content is exactly ``in_tokens`` tokens; the server's chat template adds its own per-message
  tokens on top (not counted in ``expected_prompt_tokens``).
* ``"ids"``: ``token_ids`` (completions with token ids; exact and tokenizer-free). Without a tokenizer
  ids are drawn from ``[1000, 1000 + 16384)``; with one, from the calibrated vocabulary (then
  ``token_ids`` is the tokenization of the chat-mode text).

Content rules:

* A whole block is a pure function of ``(seed, salt, scope, hash_id)`` through SHAKE-256 (never
  Python's salted ``hash()``); ``scope`` is the trace id for "local" ids (sub-agents use their parent
  trace's scope) and the dataset name for "global" ids. Different traces thus never share content.
* ``salt`` busts the server cache between plays (a recycled trace, a rerun on a warm server). Keep it
  fixed for a whole play, warmup included. For "global"-scope datasets, pass the same salt to every
  play of a run, or the intended cross-trace sharing is lost.
* The part after the last hash block (``in_tokens`` not covered by ids) is the start of the blocks
  that would come next: the weka layout's partial last id, or ids ``last+1, last+2...`` in the
  kv-cache-tester layout (which numbers new blocks in order). So when request n+1's ids extend
  request n's, n's prompt is a byte (token) prefix of n+1's.
* ``shared_prefix=True``: the whole blocks inside an owner's system + tools tokens (taken from the
  owner's first request) get content shared by all traces: keyed by (seed, "main" or the sub-agent
  type, block position), without salt. This is the one deliberate cross-trace sharing.
* ``split_system=True`` (text modes): ``system`` holds those system/tools blocks, ``text`` the rest (for a system
  message + user message); otherwise ``system`` is None and ``text`` is the whole prompt.
  ``prompt_text`` always gives the whole prompt as one string.

Cost: block contents are cached per play and each owner's last prompt is kept, so a 200k-token prompt
after a 199k-token one costs the new blocks plus one string copy.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import filterfalse
from pathlib import Path
from typing import Any, Literal

from kv_cache_tester.errors import UsageError
from kv_cache_tester.traces.model import Request, SubAgent, Trace

Mode = Literal["words", "chat", "ids"]
MODES = ("words", "chat", "ids")
FORMAT_VERSION = 1  # bump when synthesized content changes (keys on-disk caches of derived prompts)
BLOCK_CACHE_LIMIT = 8192  # blocks cached per play (the owners' last prompts are kept apart from it)
IDS_BASE = 1000
IDS_RANGE = 16384


@cache
def words_vocabulary() -> tuple[str, ...]:
    """The words-mode vocabulary: 256 distinct pronounceable lowercase words (one byte per word).

    Small on purpose: block content stays unique (256**64 blocks) while the lookups stay in CPU cache.
    """
    consonants = "bdfghjklmnprstvz"
    vowels = ["a", "e", "i", "o", "u", "ai", "au", "ea", "ee", "ei", "ia", "ie", "io", "oa", "oo", "ou"]
    syllables = [c + v for c in consonants for v in vowels]
    return tuple(syllables[i] + syllables[(i * 97 + 31) % 256] for i in range(256))


@cache
def _words_vocab() -> _Vocab:
    return _Vocab(list(words_vocabulary()), " ", bits=8)


@dataclass(slots=True)
class SynthPrompt:
    """One synthesized prompt. Text modes fill ``text`` (and ``system`` when split); ids mode ``token_ids``."""

    text: str | None
    token_ids: list[int] | None
    expected_prompt_tokens: int
    system: str | None = None
    separator: str = " "

    @property
    def prompt_text(self) -> str:
        """The whole prompt as one string (system part included)."""
        if self.system is None:
            return self.text or ""
        if not self.text:
            return self.system
        return self.system + self.separator + self.text


class _Vocab:
    """A token vocabulary: block contents are 8- or 16-bit draws mapped through ``table``."""

    def __init__(self, tokens: list[Any], separator: str, bits: int = 16) -> None:
        if not tokens:
            raise UsageError("empty synthesis vocabulary")
        self.size = len(tokens)
        self.bits = bits
        self.table = [tokens[i % len(tokens)] for i in range(1 << bits)]
        self.separator = separator


class PromptSynthesizer:
    """Builds prompts for traces; one instance per run (it holds the vocabulary)."""

    def __init__(
        self,
        mode: Mode = "words",
        seed: int = 0,
        tokenizer: Any = None,
        shared_prefix: bool = False,
        split_system: bool = False,
    ) -> None:
        if mode not in MODES:
            raise UsageError(f"synthesis mode: expected one of {', '.join(MODES)}, got {mode!r}")
        self.mode: Mode = mode
        self.seed = int(seed)
        self.shared_prefix = shared_prefix
        self.split_system = split_system
        self.tokenizer = None
        if mode == "chat" and tokenizer is None:
            raise UsageError("synthesis mode chat needs a tokenizer (path or Hugging Face model id)")
        if tokenizer is not None and mode != "words":
            self.tokenizer = load_tokenizer(tokenizer)
        if mode == "words":
            self.vocab = _words_vocab()
        elif self.tokenizer is not None:
            words = calibrate_vocabulary(self.tokenizer)
            if mode == "chat":
                self.vocab = _Vocab([" " + w for w, _ in words], "")
            else:
                self.vocab = _Vocab([i for _, i in words], "")
        else:
            self.vocab = _Vocab(list(range(IDS_BASE, IDS_BASE + IDS_RANGE)), "")

    @property
    def text_mode(self) -> bool:
        return self.mode != "ids"

    def start_play(self, trace: Trace, salt: str | int = "") -> PlaySynth:
        return PlaySynth(self, trace, str(salt))

    def block_tokens(self, key: bytes, count: int) -> list[Any]:
        """``count`` vocabulary entries drawn from ``key`` (the content of one block)."""
        table = self.vocab.table
        if self.vocab.bits == 8:
            return list(map(table.__getitem__, hashlib.shake_256(key).digest(count)))
        digest = hashlib.shake_256(key).digest(2 * count)
        return list(map(table.__getitem__, struct.unpack(f"<{count}H", digest)))


class _OwnerMemo:
    """The last prompt body built for one owner (the parent or one sub-agent)."""

    __slots__ = ("body", "ends", "ids")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.ends: list[int] = []  # body length after each block (chars, or tokens in ids mode)
        self.body: Any = ""


class PlaySynth:
    """Synthesis state for one play of one trace (fixed salt)."""

    def __init__(self, synth: PromptSynthesizer, trace: Trace, salt: str) -> None:
        self.synth = synth
        self.trace = trace
        self.salt = salt
        self.block_size = trace.block_size
        self._prefix = f"{synth.seed}\x1f{salt}\x1f{trace.scope_key}\x1f".encode()
        self._blocks: dict[int, Any] = {}  # hash id -> block content (str, or list of ids)
        self._overrides: dict[int, bytes] = {}  # hash id -> key of shared-prefix content
        self._memos: dict[str, _OwnerMemo] = {}
        self._system_blocks: dict[str, int] = {}
        self._setup_system(None, trace.system_tokens + trace.tool_tokens, trace.requests[:1])
        for group in trace.groups:
            for agent in group.agents:
                self._setup_system(agent, agent.system_tokens + agent.tool_tokens, agent.requests[:1])

    @property
    def cache_scope(self) -> str:
        """Content scope including the salt: the key to give :class:`PrefixTracker`."""
        return f"{self.trace.scope_key}|{self.salt}"

    def _setup_system(self, agent: SubAgent | None, prefix_tokens: int, first: list[Request]) -> None:
        owner = self._owner(agent)
        if not first:
            self._system_blocks[owner] = 0
            return
        req = first[0]
        n = min(prefix_tokens // self.block_size, req.full_blocks(self.block_size))
        self._system_blocks[owner] = n
        if not self.synth.shared_prefix:
            return
        kind = "main" if agent is None else f"agent:{agent.subagent_type}"
        for pos in range(n):
            hid = req.hash_ids[pos]
            self._overrides.setdefault(hid, f"{self.synth.seed}\x1fshared\x1f{kind}\x1f{pos}".encode())

    @staticmethod
    def _owner(agent: SubAgent | None) -> str:
        return "" if agent is None else f"agent:{agent.agent_id}"

    def block(self, hash_id: int) -> Any:
        """Content of a whole block: a string of ``block_size`` tokens, or a list of token ids."""
        content = self._blocks.get(hash_id)
        if content is None:
            key = self._overrides.get(hash_id) or self._prefix + str(hash_id).encode()
            tokens = self.synth.block_tokens(key, self.block_size)
            if self.synth.mode == "words":
                content = " ".join(tokens)
            elif self.synth.mode == "chat":
                content = "".join(tokens)
            else:
                content = tokens
            if len(self._blocks) >= BLOCK_CACHE_LIMIT:
                self._blocks.clear()  # bounded memory; contents are recomputed identically
            self._blocks[hash_id] = content
        return content

    def _tail(self, request: Request, nfull: int) -> Any:
        """Tokens after the last whole block: the start of the next block(s); see module doc."""
        bs = self.block_size
        remaining = request.in_tokens - nfull * bs
        ids = request.hash_ids
        if len(ids) > nfull:  # weka layout: the last id names the partial block
            next_ids = [ids[nfull]]
        else:
            last = ids[-1] if ids else 0
            next_ids = [last + 1 + k for k in range(-(-remaining // bs))]
        out: list[Any] = []
        for hid in next_ids:
            take = min(bs, remaining - len(out))
            content = self.block(hid)
            if self.synth.mode == "ids":
                out.extend(content[:take])
            elif self.synth.mode == "words":
                out.extend(content.split(" ", take)[:take])
            else:
                out.extend(self.synth.block_tokens(self._key(hid), bs)[:take])
        return out

    def _key(self, hash_id: int) -> bytes:
        return self._overrides.get(hash_id) or self._prefix + str(hash_id).encode()

    def warm(self, request: Request, batch: int = 32) -> Iterator[int]:
        """Make the whole blocks ``request``'s prompt needs and are not cached yet, ``batch`` at a
        time, yielding how many are done between batches: a caller on an event loop can let other
        work run in between (a new play's first prompt is hundreds of blocks)."""
        todo = list(
            filterfalse(self._blocks.__contains__, request.hash_ids[: request.full_blocks(self.block_size)])
        )
        for start in range(0, len(todo), batch):
            if start:
                yield start
            for hid in todo[start : start + batch]:
                self.block(hid)

    def prompt(self, request: Request, agent: SubAgent | None = None) -> SynthPrompt:
        memo, tail, owner, nfull = self._grow(request, agent)
        sep = " " if self.synth.mode == "words" else ""
        nsys = min(self._system_blocks.get(owner, 0), nfull) if self.synth.split_system else 0
        if self.synth.mode == "ids":
            token_ids = memo.body + tail if tail else list(memo.body)
            return SynthPrompt(text=None, token_ids=token_ids, expected_prompt_tokens=request.in_tokens)
        body: str = memo.body
        if tail:
            tail_text = sep.join(tail)
            body = body + sep + tail_text if body else tail_text
        system = None
        if nsys:
            cut = memo.ends[nsys - 1]
            system, body = body[:cut], body[cut + len(sep) :]
        return SynthPrompt(
            text=body,
            token_ids=None,
            expected_prompt_tokens=request.in_tokens,
            system=system,
            separator=sep,
        )

    def parts(self, request: Request, agent: SubAgent | None = None) -> tuple[Any, Any]:
        """The prompt in two parts, for a caller that encodes it and can keep the encoding of the
        first: the owner's whole blocks (text, or a list of ids in ids mode), the same object for as
        long as they do not change, and the rest (the tail, with its separator). Joined, they are
        ``prompt(request, agent).prompt_text`` (or its ``token_ids``)."""
        memo, tail, _, _ = self._grow(request, agent)
        if self.synth.mode == "ids":
            return memo.body, tail
        if not tail:
            return memo.body, ""
        sep = " " if self.synth.mode == "words" else ""
        tail_text = sep.join(tail)
        return memo.body, (sep + tail_text if memo.body else tail_text)

    def _grow(self, request: Request, agent: SubAgent | None) -> tuple[_OwnerMemo, list[Any], str, int]:
        """The owner's memo brought to ``request``'s whole blocks, the tokens after them, the owner
        and the number of whole blocks."""
        bs = self.block_size
        owner = self._owner(agent)
        memo = self._memos.get(owner)
        if memo is None:
            memo = self._memos[owner] = _OwnerMemo()
            if self.synth.mode == "ids":
                memo.body = []
        nfull = request.full_blocks(bs)
        full_ids = request.hash_ids[:nfull]
        common = common_prefix(memo.ids, full_ids)
        ids_mode = self.synth.mode == "ids"
        sep = " " if self.synth.mode == "words" else ""
        if common < len(memo.ids) or common < nfull:
            base_len = memo.ends[common - 1] if common else 0
            ends = memo.ends[:common]
            grown: Any
            if ids_mode:
                grown = memo.body[:base_len]
                for hid in full_ids[common:]:
                    grown.extend(self.block(hid))
                    ends.append(len(grown))
            else:
                parts = [memo.body[:base_len]]
                size = base_len
                for hid in full_ids[common:]:
                    text = self.block(hid)
                    if size:
                        parts.append(sep)
                        size += len(sep)
                    parts.append(text)
                    size += len(text)
                    ends.append(size)
                grown = "".join(parts)
            memo.ids, memo.ends, memo.body = full_ids, ends, grown
        tail = self._tail(request, nfull) if request.in_tokens > nfull * bs else []
        return memo, tail, owner, nfull


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items ``a`` and ``b`` share (list comparisons: no Python step per item)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


# --- tokenizer support (chat and ids modes) -------------------------------------------------------

_WORD = re.compile(r"^ [a-z]{2,12}$")


def load_tokenizer(spec: Any) -> Any:
    """A ``tokenizers.Tokenizer`` from an instance, a tokenizer.json path/folder, or an HF model id."""
    if hasattr(spec, "encode") and hasattr(spec, "get_vocab"):
        return spec
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(
            "chat/ids synthesis with a tokenizer needs the tokenizers package "
            "(pip install 'kv-cache-tester[tokenizer]')"
        ) from None
    path = Path(str(spec))
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.is_file():
        try:
            return Tokenizer.from_file(str(path))
        except Exception as err:
            raise UsageError(f"{path}: cannot load tokenizer: {err}") from None
    return _tokenizer_from_hf(str(spec))


def _tokenizer_from_hf(repo_id: str) -> Any:
    from tokenizers import Tokenizer

    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise UsageError(
            f"tokenizer {repo_id}: not a local file, and loading from Hugging Face needs huggingface_hub"
        ) from None
    from kv_cache_tester.traces.hf import hub_cache_dir, offline

    errors = []
    for local_only in (True,) if offline() else (False, True):
        try:
            file = hf_hub_download(
                repo_id, "tokenizer.json", cache_dir=str(hub_cache_dir()), local_files_only=local_only
            )
            return Tokenizer.from_file(file)
        except Exception as err:
            errors.append(err)
    raise UsageError(
        f"tokenizer {repo_id}: not a local tokenizer.json and not in the Hugging Face cache "
        f"({type(errors[-1]).__name__})"
    )


def calibrate_vocabulary(tokenizer: Any, chunk: int = 512) -> list[tuple[str, int]]:
    """Words that are exactly one token with a leading space and never merge with each other.

    Candidates are vocabulary entries decoding to a space plus 2-12 lowercase letters, each checked
    alone and then in long runs (a run whose tokenization is not exactly its words drops out).
    Sorted by token id, so the result only depends on the tokenizer.
    """
    vocab = tokenizer.get_vocab()
    ids = sorted(vocab.values())
    texts = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=True)
    cand = [(t, i) for t, i in zip(texts, ids, strict=True) if _WORD.match(t)]
    encoded = tokenizer.encode_batch([t for t, _ in cand], add_special_tokens=False)
    single = [(t[1:], i) for (t, i), e in zip(cand, encoded, strict=True) if e.ids == [i]]
    good: list[tuple[str, int]] = []
    for start in range(0, len(single), chunk):
        part = single[start : start + chunk]
        for run in (part, part[::-1]):
            got = tokenizer.encode("".join(" " + w for w, _ in run), add_special_tokens=False).ids
            if got != [i for _, i in run]:
                break
        else:
            good.extend(part)
    if len(good) < 256:
        raise UsageError(
            f"tokenizer has only {len(good)} usable single-token words (need 256) for chat/ids synthesis"
        )
    return good


# --- fixed-length synthetic workloads (the `synth` command) ---------------------------------------
#
# What vLLM's and SGLang's "random" benchmarks send: independent prompts of a given input length, each
# asking for a given output length, optionally all starting with the same prefix. Each request is one
# single-request trace, so a closed loop of N users (`replay --max-users N --recycle`) sends a new
# prompt as soon as a user's previous one finishes.

DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """A token-length distribution: ``1024``, ``uniform:LO:HI``, ``normal:MEAN:STD`` or
    ``lognormal:MEDIAN:SIGMA``. Draws are rounded and clipped to ``[minimum, MAX_SYNTH_TOKENS]``
    (``minimum`` is one token past a shared prefix for input lengths)."""

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str, what: str) -> LengthSpec:
        parts = text.strip().split(":")
        try:
            nums = [float(p) for p in parts[1:]] if len(parts) > 1 else [float(parts[0])]
        except ValueError:
            raise UsageError(
                f"{what} {text!r}: expected N, uniform:LO:HI, normal:MEAN:STD or lognormal:MEDIAN:SIGMA"
            ) from None
        kind = parts[0] if len(parts) > 1 else "fixed"
        arity = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}.get(kind)
        if arity is None or len(nums) != arity:
            raise UsageError(
                f"{what} {text!r}: expected N, uniform:LO:HI, normal:MEAN:STD or lognormal:MEDIAN:SIGMA"
            )
        if not all(n == n and abs(n) != float("inf") for n in nums):
            raise UsageError(f"{what} {text!r}: numbers must be finite")
        if kind == "fixed" and (nums[0] < 1 or not nums[0].is_integer()):
            raise UsageError(f"{what} {text!r}: a fixed length must be a positive integer")
        if kind == "uniform" and not 1 <= nums[0] <= nums[1]:
            raise UsageError(f"{what} {text!r}: need 1 <= LO <= HI")
        if kind in ("normal", "lognormal") and not (nums[0] >= 1 and nums[1] >= 0):
            raise UsageError(f"{what} {text!r}: need a centre >= 1 and a spread >= 0")
        top = nums[1] if kind == "uniform" else nums[0]
        if top > MAX_SYNTH_TOKENS:
            raise UsageError(
                f"{what} {text!r}: at most {MAX_SYNTH_TOKENS} tokens (the replayer's prompt limit)"
            )
        if kind == "lognormal" and nums[1] > MAX_LOGNORMAL_SIGMA:
            raise UsageError(f"{what} {text!r}: SIGMA must be at most {MAX_LOGNORMAL_SIGMA:g}")
        return cls(kind, nums[0], nums[1] if len(nums) > 1 else 0.0)

    def draw(self, rng: Any, minimum: int = 1, clipped: list[int] | None = None) -> int:
        """One length in ``[minimum, MAX_SYNTH_TOKENS]``; a draw outside is clipped, and counted in
        ``clipped[0]`` when given (so a caller can say how many were)."""
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.randint(round(self.a), round(self.b))
        elif self.kind == "normal":
            value = rng.gauss(self.a, self.b)
        else:  # the exponent is capped so a far tail cannot overflow (it is clipped below anyway)
            value = self.a * math.exp(min(64.0, rng.gauss(0.0, self.b)))
        n = round(value)
        if not minimum <= n <= MAX_SYNTH_TOKENS:
            n = max(minimum, min(MAX_SYNTH_TOKENS, n))
            if clipped is not None:
                clipped[0] += 1
        return n

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g}"
        return f"{self.kind}:{self.a:g}:{self.b:g}"


MAX_SYNTH_TOKENS = 4 * 1024 * 1024  # the replayer's prompt limit (replay/memory.py MAX_PROMPT_TOKENS)
MAX_SYNTH_COUNT = 1_000_000  # requests in one file; the file itself is bounded by the loader's limit
MAX_LOGNORMAL_SIGMA = 8.0


def synth_workload(
    isl: LengthSpec,
    osl: LengthSpec,
    count: int,
    *,
    seed: int = 0,
    shared_prefix: int = 0,
    block_size: int = 64,
    clipped: tuple[list[int], list[int]] | None = None,
) -> Iterator[dict[str, Any]]:
    """``count`` single-request trace objects (the kv-cache-tester JSON format), deterministic for a seed.

    Hash ids follow the weka layout (one id per block, the last naming the partial tail), so every
    prompt token belongs to a named block. Without a shared prefix the traces are "local": each trace
    has its own ids (from 0) and a replayed trace gets fresh content. With ``shared_prefix`` tokens
    (whole blocks) the traces are "global": ids ``0..k-1`` are the common prefix and every other id
    is used once in the whole file.
    """
    if not 1 <= count <= MAX_SYNTH_COUNT:
        raise UsageError(f"--count {count}: must be from 1 to {MAX_SYNTH_COUNT}")
    if not 1 <= block_size <= MAX_SYNTH_TOKENS:
        raise UsageError(f"--block-size {block_size}: must be from 1 to {MAX_SYNTH_TOKENS}")
    if not 0 <= shared_prefix < MAX_SYNTH_TOKENS:
        raise UsageError(f"--shared-prefix {shared_prefix}: must be from 0 to {MAX_SYNTH_TOKENS - 1}")
    shared_blocks = shared_prefix // block_size
    lowest = isl.a if isl.kind in ("fixed", "uniform") else None
    if shared_blocks and lowest is not None and lowest <= shared_blocks * block_size:
        raise UsageError(
            f"--shared-prefix {shared_prefix}: {shared_blocks * block_size} shared tokens leave nothing "
            f"private in a {lowest:g}-token prompt"
        )
    rng = random.Random(f"synth:{seed}")
    next_id = shared_blocks
    width = max(6, len(str(count - 1)))
    for i in range(count):
        n_in = isl.draw(rng, minimum=shared_blocks * block_size + 1, clipped=clipped[0] if clipped else None)
        n_out = osl.draw(rng, clipped=clipped[1] if clipped else None)
        nblocks = -(-n_in // block_size)
        if shared_blocks:
            ids = list(range(shared_blocks)) + list(range(next_id, next_id + nblocks - shared_blocks))
            next_id += nblocks - shared_blocks
        else:
            ids = list(range(nblocks))
        yield {
            "id": f"synth-{i:0{width}d}",
            "block_size": block_size,
            "hash_id_scope": "global" if shared_blocks else "local",
            "requests": [{"t": 0.0, "in": n_in, "out": n_out, "hash_ids": ids}],
        }
