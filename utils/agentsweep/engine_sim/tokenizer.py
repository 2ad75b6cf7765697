"""Deterministic word-level tokenizer and chat template.

One whitespace-separated word is one token. A word's id comes from a stable hash of its UTF-8 bytes
(BLAKE2b, 32 bits), offset past a small range of reserved ids, so the same word has the same id in
every process and run. Prompts given as token ids are used as they are.

Chat template (documented overhead): every message renders as
``<role> <sep> content... <end>`` (3 tokens on top of its words) and the prompt ends with the
generation marker ``<assistant> <sep>`` (2 tokens). So a chat prompt of ``m`` messages with ``w``
words in total is ``w + 3*m + 2`` tokens. A conversation that extends another renders as a token
prefix of it apart from the trailing 2-token marker (and when the next message is the assistant's
reply, the marker itself is reused: it equals the reply's role and separator tokens).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

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


class _Vocab(dict[str, int]):
    """word -> id, filled on demand (``__missing__``) so lookups of known words stay in C."""

    def __missing__(self, word: str) -> int:
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=4).digest()
        wid = RESERVED_IDS + int.from_bytes(digest, "little") % VOCAB_SPAN
        self[word] = wid
        return wid


_VOCAB = _Vocab()


def word_id(word: str) -> int:
    """The stable id of one word."""
    return _VOCAB[word]


def encode(text: str) -> list[int]:
    """Token ids of a text: one per whitespace-separated word."""
    return list(map(_VOCAB.__getitem__, text.split()))


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


def segment_ids(
    segments: Iterable[tuple[Sequence[int], str | Sequence[int]]], closing: Sequence[int] = ()
) -> list[int]:
    """Token ids of a prompt given as segments (template ids, then text or token ids) and closing ids."""
    ids: list[int] = []
    for head, content in segments:
        ids.extend(head)
        ids.extend(encode(content) if isinstance(content, str) else content)
    ids.extend(closing)
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


def is_token_ids(value: Iterable[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
