"""Word-level tokenizer: stable ids across processes, documented chat overhead, prefix property."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from agentsweep.engine_sim import tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.mark.integration
def test_word_ids_are_stable_across_processes():
    words = ["alpha", "beta", "ünïcode", "x"]
    code = "from agentsweep.engine_sim import tokenizer as t; print(t.encode('alpha beta ünïcode x'))"
    env = {**os.environ, "PYTHONHASHSEED": "123"}  # Python's own str hash differs; ours must not
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == str(tokenizer.encode(" ".join(words)))
    ids = tokenizer.encode("alpha  beta\n\tünïcode x")  # any whitespace separates
    assert len(ids) == 4 and len(set(ids)) == 4
    assert all(i >= tokenizer.RESERVED_IDS for i in ids)


def test_chat_overhead_is_documented_constant():
    msgs = [
        {"role": "system", "content": "a b"},
        {"role": "user", "content": [{"type": "text", "text": "c d e"}]},
    ]
    assert len(tokenizer.render_chat(msgs)) == 5 + tokenizer.chat_overhead(2) == 5 + 3 * 2 + 2


words = st.lists(st.sampled_from(["a", "b", "c", "dd", "e"]), max_size=8).map(" ".join)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": words}
)


@given(st.lists(message, min_size=1, max_size=5), st.lists(message, min_size=1, max_size=5))
def test_extended_conversation_is_a_token_prefix(first, more):
    a = tokenizer.render_chat(first)
    b = tokenizer.render_chat(first + more)
    assert b[: len(a) - 2] == a[:-2]
    assert a[-2:] == list(tokenizer.GENERATION_PROMPT)
    if more[0]["role"] == "assistant":
        assert b[: len(a)] == a


ascii_words = st.text(
    alphabet=st.characters(codec="ascii", exclude_characters=" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"),
    min_size=1,
    max_size=12,
)
ascii_space = st.sampled_from([" ", "  ", "\n", "\t", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", " \n "])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(ascii_words, ascii_space), min_size=1, max_size=40), st.booleans())
def test_long_ascii_texts_tokenize_as_word_by_word(pairs, pad):
    """The array path (long ASCII texts) gives every word the id the word-by-word path gives it."""
    text = "".join(w + s for w, s in pairs)
    while len(text) < 3000:  # long enough for the array path
        text += text
    if pad:
        text = " \n" + text
    words = text.split()
    assert tokenizer.encode(text) == [tokenizer.word_id(w) for w in words]
    assert tokenizer.encode_array(text).tolist() == tokenizer.encode(text)
    # Not ASCII: word by word, with the same id for the same word.
    mixed = text + " ünïcode " + words[0]
    assert tokenizer.encode(mixed)[: len(words)] == tokenizer.encode(text)
    assert tokenizer.encode(mixed)[-1] == tokenizer.word_id(words[0])
