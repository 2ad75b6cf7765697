"""Deterministic word-level tokenizer and chat template.

One whitespace-separated word is one token. A word's id comes from a stable hash of its UTF-8 bytes
(a 64-bit polynomial hash, its high 32 bits), offset past a small range of reserved ids, so the same
word has the same id in every process and run. Prompts given as token ids are used as they are.

The hash is polynomial so that a long ASCII text is tokenized in a few array operations (numpy):
prefix sums of the bytes give every word's hash at once. A fresh 20k-word agentic prompt costs
about a quarter of what splitting it into Python strings and looking each one up did.

Chat template (documented overhead): every message renders as
``<role> <sep> content... <end>`` (3 tokens on top of its words) and the prompt ends with the
generation marker ``<assistant> <sep>`` (2 tokens). So a chat prompt of ``m`` messages with ``w``
words in total is ``w + 3*m + 2`` tokens. A conversation that extends another renders as a token
prefix of it apart from the trailing 2-token marker (and when the next message is the assistant's
reply, the marker itself is reused: it equals the reply's role and separator tokens).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

RESERVED_IDS = 1000  # ids below this are special tokens; word ids start here
VOCAB_SPAN = (1 << 32) - RESERVED_IDS
SEP_ID = 1
END_ID = 2
ROLE_IDS: dict[str, int] = {
    "system": 10,
    "developer": 11,
    "user": 12,
    "assistant": 13,
    "tool": 14,
    "function": 15,
}
OTHER_ROLE_ID = 19
MESSAGE_OVERHEAD = 3  # role, separator, end
GENERATION_PROMPT = (ROLE_IDS["assistant"], SEP_ID)

_CACHE_LIMIT = 1 << 20
_MASK64 = (1 << 64) - 1
_P = 0x100000001B3  # the polynomial's base (odd, so it has an inverse modulo 2**64)
_P_INV = pow(_P, -1, 1 << 64)
# Shorter texts cost less word by word. In a busy simulator the word-by-word path misses the CPU
# caches (a dictionary of every word seen, a fresh string per word) and a turn's 200 new words cost
# it about three times what the array path does, so only short texts take it.
_ARRAY_MIN_CHARS = 256


_POWERS = [pow(_P, j, 1 << 64) for j in range(64)]


def _word_hash(data: bytes) -> int:
    """sum(byte[j] * P**j) mod 2**64: the same value the array path computes from prefix sums."""
    if len(data) <= len(_POWERS):  # reduced once at the end: the same value modulo 2**64
        total: int = sum(map(operator.mul, data, _POWERS))
        return total & _MASK64
    h = 0
    power = 1
    for byte in data:
        h = (h + byte * power) & _MASK64
        power = (power * _P) & _MASK64
    return h


def _id_of_hash(h: int) -> int:
    return RESERVED_IDS + (h >> 32) % VOCAB_SPAN


class _Vocab(dict[str, int]):
    """word -> id, filled on demand (``__missing__``) so lookups of known words stay in C."""

    def __missing__(self, word: str) -> int:
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        wid = _id_of_hash(_word_hash(word.encode("utf-8", "surrogatepass")))
        self[word] = wid
        return wid


_VOCAB = _Vocab()


class _Tables:
    """P**i and P**-i modulo 2**64, and scratch arrays, for texts of up to ``size`` bytes (grown on demand).

    The scratch arrays are reused from call to call: a fresh megabyte-sized array per prompt costs
    more in page faults than the arithmetic done in it.
    """

    def __init__(self) -> None:
        self.size = 0
        self._grow(1 << 16)

    def _grow(self, n: int) -> None:
        self.size = n
        self.up = self._powers(_P, n)
        self.down = self._powers(_P_INV, n)
        self.product = np.empty(n, dtype=np.uint64)
        self.prefix = np.zeros(n + 1, dtype=np.uint64)  # prefix[0] stays 0
        self.in_word = np.zeros(n + 2, dtype=np.int8)  # [0] and past the text stay 0
        self.edges = np.empty(n + 1, dtype=np.int8)

    def fit(self, n: int) -> None:
        if n > self.size:
            self._grow(max(n, 2 * self.size))

    @staticmethod
    def _powers(base: int, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.uint64)
        out[0] = 1
        np.cumprod(np.full(n - 1, base, dtype=np.uint64), out=out[1:])  # wraps modulo 2**64
        return out


_TABLES = _Tables()


def word_id(word: str) -> int:
    """The stable id of one word."""
    return _VOCAB[word]


def _encode_ascii(text: str) -> np.ndarray:
    """Token ids of an ASCII text, every word's hash from prefix sums of its bytes."""
    data = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    n = len(data)
    t = _TABLES
    t.fit(n)
    in_word = t.in_word
    in_word[n + 1] = 0
    word = in_word[1 : n + 1].view(np.bool_)
    # Not whitespace as str.split() sees ASCII: \t \n \v \f \r (9-13), the separators 28-31, space.
    np.greater(data, 32, out=word)
    word |= data < 9
    word |= (data > 13) & (data < 28)
    edges = np.subtract(in_word[1 : n + 2], in_word[: n + 1], out=t.edges[: n + 1])
    bounds = np.flatnonzero(edges)  # word starts and ends alternate
    starts = bounds[0::2]  # a word starts at byte i ...
    ends = bounds[1::2]  # ... and ends before byte j
    np.multiply(data, t.up[:n], out=t.product[:n])
    np.cumsum(t.product[:n], out=t.prefix[1 : n + 1])
    hashes = (t.prefix[ends] - t.prefix[starts]) * t.down[starts]
    ids: np.ndarray = (hashes >> np.uint64(32)) % np.uint64(VOCAB_SPAN) + np.uint64(RESERVED_IDS)
    return ids


def _array_path(text: str) -> bool:
    """Long ASCII texts cost less in array operations than word by word."""
    return len(text) >= _ARRAY_MIN_CHARS and text.isascii()


def _word_ids(text: str) -> list[int]:
    return list(map(_VOCAB.__getitem__, text.split()))


def encode_array(text: str) -> np.ndarray:
    """Token ids of a text as a uint64 array: one per whitespace-separated word."""
    return _encode_ascii(text) if _array_path(text) else np.array(_word_ids(text), dtype=np.uint64)


def encode(text: str) -> list[int]:
    """Token ids of a text: one per whitespace-separated word."""
    return _encode_ascii(text).tolist() if _array_path(text) else _word_ids(text)


def count_words(text: str) -> int:
    return len(text.split())


def _content_text(content: Any) -> str:
    """A message's content: a string, or OpenAI content parts (text parts are joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return " ".join(parts)
    raise ValueError("message content must be a string or a list of content parts")


def chat_segments(
    messages: Sequence[Any], add_generation_prompt: bool = True
) -> tuple[list[tuple[tuple[int, ...], str]], tuple[int, ...]]:
    """A conversation as segments (template ids, content text), one per message, and closing ids.

    The ids of the conversation are the segments' ids in order, then the closing ids: so a
    conversation that extends another shares every segment but the last, whose text it continues.
    """
    segments: list[tuple[tuple[int, ...], str]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object")
        role = msg.get("role")
        if not isinstance(role, str):
            raise ValueError(f"messages[{i}].role must be a string")
        head = (ROLE_IDS.get(role, OTHER_ROLE_ID), SEP_ID)
        segments.append(((END_ID, *head) if i else head, _content_text(msg.get("content"))))
    closing = (END_ID, *GENERATION_PROMPT) if add_generation_prompt else (END_ID,)
    return segments, closing if segments else ()


def segment_array(
    segments: Iterable[tuple[Sequence[int], str | Sequence[int]]], closing: Sequence[int] = ()
) -> np.ndarray:
    """Token ids (uint64) of a prompt given as segments (template ids, then text or token ids) and
    closing ids."""
    parts: list[Any] = []
    for head, content in segments:
        if head:
            parts.append(head)
        if isinstance(content, str):
            parts.append(encode_array(content))
        elif content:
            parts.append(content)
    if closing:
        parts.append(closing)
    if not parts:
        return np.empty(0, dtype=np.uint64)
    return np.concatenate([np.asarray(p, dtype=np.uint64) for p in parts])


def segment_ids(
    segments: Iterable[tuple[Sequence[int], str | Sequence[int]]], closing: Sequence[int] = ()
) -> list[int]:
    """``segment_array`` as a list of ints."""
    ids: list[int] = segment_array(segments, closing).tolist()
    return ids


def render_chat(messages: Sequence[Any], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a chat conversation under the template above."""
    segments, closing = chat_segments(messages, add_generation_prompt)
    if not segments and add_generation_prompt:
        return list(GENERATION_PROMPT)
    return segment_ids(segments, closing)


def chat_overhead(num_messages: int, add_generation_prompt: bool = True) -> int:
    """Template tokens a chat prompt adds on top of its words."""
    return MESSAGE_OVERHEAD * num_messages + (len(GENERATION_PROMPT) if add_generation_prompt else 0)


# Generated text: a fixed cycle of plain words, one token each (with a leading space).
_OUTPUT_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "have",
    "not",
    "but",
    "which",
    "they",
    "one",
    "all",
    "were",
    "we",
    "when",
    "there",
    "can",
    "been",
    "has",
    "more",
    "if",
    "will",
    "would",
    "so",
    "no",
    "what",
    "up",
    "out",
    "about",
    "into",
]
_OUT = [" " + w for w in _OUTPUT_WORDS]
_NOUT = len(_OUT)
_CYCLE2 = "".join(_OUT) * 2
_OFFS = [0]
for _w in _OUT * 2:
    _OFFS.append(_OFFS[-1] + len(_w))


def output_text(start: int, count: int) -> str:
    """The text of generated tokens ``start .. start+count-1`` (deterministic, no per-token work)."""
    s = start % _NOUT
    if count == 1:
        return _OUT[s]
    full, rest = divmod(count, _NOUT)
    text = _CYCLE2[_OFFS[s] : _OFFS[s + rest]]
    if full:
        text = _CYCLE2[_OFFS[s] : _OFFS[s + _NOUT]] * full + text
    return text


MAX_TOKEN_ID = (1 << 32) - 1


def is_token_ids(value: Iterable[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in value)
