"""Word-level tokenizer: stable ids across processes, documented chat overhead, prefix property."""

from __future__ import annotations

import os
import subprocess
import sys

from agentsweep.engine_sim import tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st


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


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "bb", "c", " ", "  ", "\n", "dd e"]), min_size=0, max_size=30),
    st.lists(st.sampled_from(["a", "bb", "c", " ", "\n", "x"]), min_size=0, max_size=10),
)
def test_incremental_encoder_always_equals_a_fresh_encode(first, more):
    """Reusing an earlier prompt's ids never changes the result, word boundaries included."""
    enc = tokenizer.IncrementalEncoder()
    enc.KEY_CHARS = 4  # both texts share this key, so the second one may reuse the first's ids
    a = "key " + "".join(first)
    b = a + "".join(more)
    assert enc.encode(a) == tokenizer.encode(a)
    got = enc.encode(b)
    assert got == tokenizer.encode(b)
    got.append(-1)  # the caller's copy is its own
    assert enc.encode(b) == tokenizer.encode(b)
    assert enc.reused >= 1  # the identical third text always reuses


def test_incremental_encoder_reuses_a_grown_prompt():
    enc = tokenizer.IncrementalEncoder()
    base = " ".join(f"w{i}" for i in range(600))
    enc.encode(base)
    assert enc.encode(base + " more words") == tokenizer.encode(base + " more words")
    assert enc.encode(base + "x tail") == tokenizer.encode(base + "x tail")  # mid-word: no reuse
    assert enc.reused == 1


def test_incremental_encoder_stays_within_its_token_budget():
    enc = tokenizer.IncrementalEncoder(max_tokens=100)
    for i in range(50):
        enc.encode(f"p{i} " + "w " * 30)
    assert enc._tokens <= 100
