"""Prompt synthesis invariants on the shared traces (words and ids modes)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from kv_cache_tester.errors import UsageError
from kv_cache_tester.traces import PromptSynthesizer, Request, Trace, load_traces


@pytest.fixture(scope="module")
def traces() -> dict[str, Trace]:
    root = Path(__file__).resolve().parents[2] / "sample_traces"
    return {t.trace_id: t for t in load_traces(root).traces}


def _extends(a: Request, b: Request) -> bool:
    return len(b.hash_ids) > len(a.hash_ids) and b.hash_ids[: len(a.hash_ids)] == a.hash_ids


@pytest.mark.parametrize("mode", ["words", "ids"])
def test_prefix_property_and_exact_length(traces: dict[str, Trace], mode: str) -> None:
    synth = PromptSynthesizer(mode, seed=3)
    checked = 0
    for tid in ("trace_0504", "trace_0291", "trace_0021", "trace_0277"):
        trace = traces[tid]
        play = synth.start_play(trace, salt="s1")
        owners: dict[str, tuple[Request, object]] = {}
        for _, agent, req in trace.timeline():
            p = play.prompt(req, agent)
            content = p.token_ids if mode == "ids" else p.text
            if mode == "ids":
                assert len(content) == req.in_tokens
            else:
                assert p.text.split(" ") == p.text.split() and len(p.text.split(" ")) == req.in_tokens
            assert p.expected_prompt_tokens == req.in_tokens
            key = "" if agent is None else agent.agent_id
            if key in owners:
                prev_req, prev_content = owners[key]
                if _extends(prev_req, req):
                    assert content[: len(prev_content)] == prev_content
                    checked += 1
            owners[key] = (req, content)
    assert checked > 50


def test_memoized_prompts_equal_fresh_ones(traces: dict[str, Trace]) -> None:
    synth = PromptSynthesizer("words", seed=9)
    trace = traces["trace_0277"]
    play = synth.start_play(trace, salt=1)
    for _, agent, req in trace.timeline():
        fresh = synth.start_play(trace, salt=1).prompt(req, agent)
        assert play.prompt(req, agent).text == fresh.text


def _block_texts(text: str, n: int, bs: int = 64) -> list[str]:
    words = text.split(" ")
    return [" ".join(words[k * bs : (k + 1) * bs]) for k in range(n)]


def test_subagent_blocks_reuse_parent_content(traces: dict[str, Trace]) -> None:
    trace = traces["trace_0291"]
    play = PromptSynthesizer("words", seed=0).start_play(trace, salt="x")
    content: dict[int, str] = {}
    shared = 0
    for _, agent, req in trace.timeline():
        blocks = _block_texts(play.prompt(req, agent).text, len(req.hash_ids))
        for hid, block in zip(req.hash_ids, blocks, strict=True):
            if hid in content:
                assert content[hid] == block
                shared += 1
            content[hid] = block
    agents = [a for g in trace.groups for a in g.agents]
    assert agents[0].requests[0].hash_ids[:5] == agents[1].requests[0].hash_ids[:5]
    assert shared > 1000


def test_same_id_in_two_traces_differs(traces: dict[str, Trace]) -> None:
    synth = PromptSynthesizer("words", seed=0)
    a, b = traces["trace_0504"], traces["trace_0058"]
    assert a.requests[0].hash_ids[0] == b.requests[0].hash_ids[0] == 1
    block_a = synth.start_play(a, "s").block(1)
    block_b = synth.start_play(b, "s").block(1)
    assert block_a != block_b
    assert len(block_a.split(" ")) == 64


def test_salt_and_seed_change_content(traces: dict[str, Trace]) -> None:
    trace = traces["trace_0504"]
    base = PromptSynthesizer("words", seed=0).start_play(trace, "a").block(5)
    assert PromptSynthesizer("words", seed=0).start_play(trace, "a").block(5) == base
    assert PromptSynthesizer("words", seed=0).start_play(trace, "b").block(5) != base
    assert PromptSynthesizer("words", seed=1).start_play(trace, "a").block(5) != base


_DIGEST = """
import hashlib, sys
from kv_cache_tester.traces import PromptSynthesizer, load_traces
trace = load_traces(sys.argv[1]).traces[0]
play = PromptSynthesizer(sys.argv[2], seed=42).start_play(trace, "salt")
h = hashlib.sha256()
for _, agent, req in trace.timeline():
    p = play.prompt(req, agent)
    h.update(p.text.encode() if p.text is not None else repr(p.token_ids).encode())
print(h.hexdigest())
"""


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["words", "ids"])
def test_same_seed_same_bytes_in_two_processes(sample_traces: Path, mode: str) -> None:
    path = str(sample_traces / "trace_0021.json")
    outs = []
    for hashseed in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-c", _DIGEST, path, mode],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": hashseed, "PATH": "/usr/bin:/bin"},
        )
        outs.append(proc.stdout.strip())
    assert outs[0] == outs[1] and len(outs[0]) == 64


def test_tail_is_start_of_next_block(traces: dict[str, Trace]) -> None:
    trace = traces["trace_0504"]
    play = PromptSynthesizer("words", seed=0).start_play(trace, "s")
    req = trace.requests[0]  # 11133 tokens: 173 blocks + 61-token tail
    words = play.prompt(req).text.split(" ")
    assert words[173 * 64 :] == play.block(174).split(" ")[:61]


def test_weka_partial_last_block() -> None:
    req = Request(index=0, t=0.0, in_tokens=100, out_tokens=1, hash_ids=[0, 7])
    trace = Trace("w", "mem", 64, "local", [req])
    play = PromptSynthesizer("ids", seed=0).start_play(trace, "")
    ids = play.prompt(req).token_ids
    assert ids == play.block(0) + play.block(7)[:36]


def test_shared_prefix_shares_system_blocks_across_traces(traces: dict[str, Trace]) -> None:
    synth = PromptSynthesizer("words", seed=0, shared_prefix=True, split_system=True)
    a, b = traces["trace_0021"], traces["trace_0016"]
    pa = synth.start_play(a, "x").prompt(a.requests[0])
    pb = synth.start_play(b, "y").prompt(b.requests[0])
    na = (a.system_tokens + a.tool_tokens) // 64
    nb = (b.system_tokens + b.tool_tokens) // 64
    assert pa.system is not None and len(pa.system.split(" ")) == na * 64
    shared = min(na, nb) * 64
    assert pa.system.split(" ")[:shared] == pb.system.split(" ")[:shared]
    assert pa.prompt_text.split(" ")[na * 64] != pb.prompt_text.split(" ")[na * 64]
    assert len(pa.prompt_text.split(" ")) == a.requests[0].in_tokens
    plain = PromptSynthesizer("words", seed=0).start_play(a, "x").prompt(a.requests[0])
    assert plain.system is None and plain.text != pa.prompt_text


def test_bad_mode_and_missing_tokenizer() -> None:
    with pytest.raises(UsageError, match="expected one of words, chat, ids"):
        PromptSynthesizer("poem")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="needs a tokenizer"):
        PromptSynthesizer("chat")


def test_next_prompt_costs_only_new_blocks(traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch) -> None:
    synth = PromptSynthesizer("words", seed=0)
    trace = traces["trace_0291"]
    play = synth.start_play(trace, "s")
    calls: list[bytes] = []
    real = synth.block_tokens

    def counting(key: bytes, count: int) -> list:
        calls.append(key)
        return real(key, count)

    monkeypatch.setattr(synth, "block_tokens", counting)
    lookups: list[int] = []
    real_block = play.block

    def counting_block(hid: int) -> object:
        lookups.append(hid)
        return real_block(hid)

    monkeypatch.setattr(play, "block", counting_block)
    reqs = trace.requests
    pairs = [(a, b) for a, b in itertools.pairwise(reqs) if _extends(a, b)]
    assert len(pairs) > 5
    for a, b in pairs:
        play.prompt(a)
        calls.clear()
        lookups.clear()
        play.prompt(b)
        assert len(lookups) <= len(b.hash_ids) - len(a.hash_ids) + 1  # no rebuild of the shared prefix
        # new whole blocks (the first was already generated as a's tail) plus b's own tail block
        new = len(b.hash_ids) - len(a.hash_ids)
        assert new - 1 <= len(calls) <= new + 1


def test_warm_makes_a_prompts_blocks_a_batch_at_a_time(
    traces: dict[str, Trace], monkeypatch: pytest.MonkeyPatch
) -> None:
    synth = PromptSynthesizer("words", seed=0)
    trace = traces["trace_0291"]
    req = max(trace.requests, key=lambda r: r.full_blocks(trace.block_size))
    nfull = req.full_blocks(trace.block_size)
    expected = synth.start_play(trace, "w").prompt(req)
    play = synth.start_play(trace, "w")
    calls: list[bytes] = []
    real = synth.block_tokens

    def counting(key: bytes, count: int) -> list:
        calls.append(key)
        return real(key, count)

    monkeypatch.setattr(synth, "block_tokens", counting)
    distinct = len(set(req.hash_ids[:nfull]))
    assert distinct > 16
    assert list(play.warm(req, batch=8)) == list(range(8, distinct, 8))  # a yield between batches
    assert len(calls) == distinct
    calls.clear()
    assert play.prompt(req) == expected  # the same prompt, from the warmed blocks
    assert len(calls) <= 2  # only its tail
    assert list(play.warm(req)) == [] and len(calls) <= 2  # nothing left to make
