"""PromptMemo: reusing an earlier prompt's tokens and hashes never changes the result."""

from __future__ import annotations

from agentsweep.engine_sim import tokenizer
from agentsweep.engine_sim.kv_cache import block_hashes
from agentsweep.engine_sim.prompt_memo import PromptMemo
from hypothesis import given, settings
from hypothesis import strategies as st

BS = 4


def reference(messages: list[dict], add_generation_prompt: bool = True) -> tuple[int, list[int]]:
    ids = tokenizer.render_chat(messages, add_generation_prompt)
    return len(ids), block_hashes(ids, BS)


def memo_chat(memo: PromptMemo, messages: list[dict], key: str | None = "s") -> tuple[int, list[int]]:
    segments, closing = tokenizer.chat_segments(messages)
    got = memo.blocks(segments, closing, key)
    return got.length, got.hashes


pieces = st.sampled_from(["a", "bb", "c", " ", "  ", "\n", "dd e", "x"])
text = st.lists(pieces, max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(text, text, text, st.booleans())
def test_a_growing_message_equals_a_fresh_render(first, more, reply, add_turn):
    """Word boundaries, empty texts and new messages included: the memo equals the full render."""
    memo = PromptMemo(BS)
    turn1 = [{"role": "user", "content": first}]
    turn2 = [{"role": "user", "content": first + more}]
    if add_turn:
        turn2 += [{"role": "assistant", "content": reply}, {"role": "user", "content": more}]
    assert memo_chat(memo, turn1) == reference(turn1)
    assert memo_chat(memo, turn2) == reference(turn2)
    assert memo_chat(memo, turn2) == reference(turn2)  # identical again
    assert memo.reused >= 1


@settings(max_examples=200, deadline=None)
@given(text, text)
def test_completions_text_equals_a_fresh_encode(first, more):
    memo = PromptMemo(BS)
    for prompt in (first, first + more, first):  # grow, then shrink (no reuse possible)
        got = memo.blocks([((), prompt)], (), "s")
        ids = tokenizer.encode(prompt)
        assert (got.length, got.hashes) == (len(ids), block_hashes(ids, BS))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=40), st.lists(st.integers(0, 9), max_size=20))
def test_token_id_prompts_equal_a_fresh_hash(first, more):
    memo = PromptMemo(BS)
    for prompt in (first, first + more, [7, *first]):
        got = memo.blocks([((), prompt)], (), "s")
        assert (got.length, got.hashes) == (len(prompt), block_hashes(prompt, BS))


def test_a_grown_prompt_is_reused_and_a_different_one_is_not():
    memo = PromptMemo(BS)
    base = " ".join(f"w{i}" for i in range(600))
    memo.blocks([((), base)], (), "s")
    assert memo.blocks([((), base + " more words")], (), "s").length == 602
    assert memo.reused == 1
    memo.blocks([((), base + "x tail")], (), "s")  # continues mid-word: not an extension
    assert memo.reused == 1
    changed = [{"role": "system", "content": "other"}, {"role": "user", "content": base}]
    memo_chat(memo, [{"role": "system", "content": "sys"}, {"role": "user", "content": base}], "c")
    assert memo_chat(memo, changed, "c") == reference(changed)  # an earlier message changed
    assert memo.reused == 1


def test_sessions_do_not_mix_and_memory_stays_within_budget():
    memo = PromptMemo(BS, max_bytes=2000)
    for i in range(50):
        prompt = f"p{i} " + "w " * 300
        assert memo.blocks([((), prompt)], (), f"session-{i}").length == 301
    assert memo._bytes <= 2000
    assert len(memo._entries) < 50


def test_without_prefix_caching_only_lengths_are_kept():
    memo = PromptMemo(BS, hashing=False)
    memo.blocks([((), "a b c d e")], (), "s")
    got = memo.blocks([((), "a b c d e f g h i")], (), "s")
    assert (got.length, got.hashes) == (9, [])
    assert memo.reused == 1
