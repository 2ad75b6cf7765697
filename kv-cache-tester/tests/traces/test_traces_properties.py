"""Property tests (hypothesis) for synthesis, loading and the cache models."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_cache_tester.traces import (
    LRUPrefixCache,
    PrefixTracker,
    PromptSynthesizer,
    Request,
    Trace,
    load_traces,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def traces(draw: st.DrawFn, weka: bool | None = None) -> Trace:
    """A trace whose requests keep a prefix of the previous ids and add new ones from a counter."""
    bs = draw(st.sampled_from([2, 4, 8, 16]))
    layout_weka = draw(st.booleans()) if weka is None else weka
    counter = 0 if layout_weka else 1
    prev: list[int] = []
    reqs = []
    for i in range(draw(st.integers(1, 8))):
        keep = draw(st.integers(0, len(prev)))
        new = draw(st.integers(0 if keep else 1, 6))
        full = prev[:keep] + list(range(counter, counter + new))
        counter += new
        tail = draw(st.integers(0 if full else 1, bs - 1))
        in_tokens = len(full) * bs + tail
        ids = list(full)
        if layout_weka and tail:
            ids.append(counter)
            counter += 1
        reqs.append(Request(index=i, t=float(i), in_tokens=in_tokens, out_tokens=1, hash_ids=ids))
        prev = full
    tid = draw(st.sampled_from(["a", "b", "trace_1"]))
    return Trace(trace_id=tid, source="mem", block_size=bs, hash_id_scope="local", requests=reqs)


def _content(p: object) -> list:
    return p.token_ids if p.token_ids is not None else p.prompt_text.split(" ")  # type: ignore[attr-defined]


@SETTINGS
@given(trace=traces(weka=False), mode=st.sampled_from(["words", "ids"]), seed=st.integers(0, 2**32))
def test_length_and_prefix_property(trace: Trace, mode: str, seed: int) -> None:
    play = PromptSynthesizer(mode, seed=seed).start_play(trace, "s")  # type: ignore[arg-type]
    bs = trace.block_size
    prev_req, prev = None, None
    for req in trace.requests:
        content = _content(play.prompt(req))
        assert len(content) == req.in_tokens
        if prev_req is not None and prev is not None:
            n = len(prev_req.hash_ids)
            if req.hash_ids[:n] == prev_req.hash_ids:
                # the whole blocks always carry over
                assert content[: n * bs] == prev[: n * bs]
                nxt = (prev_req.hash_ids[-1] if prev_req.hash_ids else 0) + 1
                if len(req.hash_ids) > n and req.hash_ids[n] == nxt:
                    assert content[: len(prev)] == prev
        prev_req, prev = req, content


@SETTINGS
@given(trace=traces(), mode=st.sampled_from(["words", "ids"]), order=st.randoms(use_true_random=False))
def test_memo_never_changes_content(trace: Trace, mode: str, order: object) -> None:
    synth = PromptSynthesizer(mode, seed=1, split_system=False)  # type: ignore[arg-type]
    reqs = list(trace.requests)
    order.shuffle(reqs)  # type: ignore[attr-defined]
    play = synth.start_play(trace, 7)
    for req in reqs + reqs[::-1]:
        assert _content(play.prompt(req)) == _content(synth.start_play(trace, 7).prompt(req))


@SETTINGS
@given(trace=traces(), mode=st.sampled_from(["words", "ids"]))
def test_same_id_same_block_content_everywhere(trace: Trace, mode: str) -> None:
    play = PromptSynthesizer(mode, seed=2).start_play(trace, "x")  # type: ignore[arg-type]
    bs = trace.block_size
    seen: dict[int, list] = {}
    for req in trace.requests:
        content = _content(play.prompt(req))
        for k, hid in enumerate(req.hash_ids[: req.in_tokens // bs]):
            block = content[k * bs : (k + 1) * bs]
            assert seen.setdefault(hid, block) == block


@SETTINGS
@given(hid=st.integers(0, 10**9), seed=st.integers(0, 100), salt=st.text(max_size=5))
def test_scope_salt_and_seed_separate_content(hid: int, seed: int, salt: str) -> None:
    def block(tid: str, s: int, sa: str) -> str:
        req = Request(index=0, t=0, in_tokens=64, out_tokens=1, hash_ids=[hid])
        return (
            PromptSynthesizer("words", seed=s).start_play(Trace(tid, "m", 64, "local", [req]), sa).block(hid)
        )

    base = block("t1", seed, salt)
    assert base == block("t1", seed, salt)
    assert base != block("t2", seed, salt)
    assert base != block("t1", seed + 1, salt)
    assert base != block("t1", seed, salt + "!")


@SETTINGS
@given(seqs=st.lists(st.lists(st.integers(0, 12), max_size=10), max_size=12), cap=st.integers(0, 40))
def test_cache_models_against_brute_force(seqs: list[list[int]], cap: int) -> None:
    tracker, lru, big = PrefixTracker(), LRUPrefixCache(cap, second_tier=3), LRUPrefixCache(10**6)
    seen: set[int] = set()
    for ids in seqs:
        expect = 0
        while expect < len(ids) and ids[expect] in seen:
            expect += 1
        assert tracker.observe(ids, "s") == expect
        assert big.observe(ids, "s") == (expect, 0)
        h1, h2 = lru.observe(ids, "s")
        assert 0 <= h1 + h2 <= expect
        assert len(lru) <= cap + 3
        seen.update(ids)
    assert PrefixTracker().observe([1, 2], "other") == 0


@SETTINGS
@given(trace=traces())
def test_json_round_trip(trace: Trace) -> None:
    doc = {
        "id": trace.trace_id,
        "block_size": trace.block_size,
        "hash_id_scope": "local",
        "requests": [
            {"t": r.t, "type": "n", "in": r.in_tokens, "out": r.out_tokens, "hash_ids": r.hash_ids}
            for r in trace.requests
        ],
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        path.write_text(json.dumps(doc))
        loaded = load_traces(path).traces[0]
    assert loaded.requests == trace.requests
    assert loaded.block_size == trace.block_size
