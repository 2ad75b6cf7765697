"""The KV-pressure comparison's own arithmetic (scripts/vllm_cpu/kv_pressure.py; `make kv-pressure` runs it
against a real vLLM): trace scaling, the working set, pool sizes and the per-ratio verdict."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kvp():  # type: ignore[no-untyped-def]
    path = REPO / "scripts" / "vllm_cpu" / "kv_pressure.py"
    spec = importlib.util.spec_from_file_location("kv_pressure", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kv_pressure"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_a_scaled_trace_keeps_its_prefix_structure(kvp) -> None:
    data = json.loads((REPO / "kv-cache-tester" / "sample_traces" / "trace_0254.json").read_text())
    scaled = kvp.scale_trace(data, 16)
    assert "totals" not in scaled and scaled["block_size"] == data["block_size"]
    assert scaled["tool_tokens"] == math.ceil(data["tool_tokens"] / 16)

    def flat(reqs: list[dict]) -> list[dict]:
        return [x for r in reqs for x in ([r] if "in" in r else flat(r["requests"]))]

    before, after = flat(data["requests"]), flat(scaled["requests"])
    assert len(before) == len(after) > 100  # sub-agents' requests included
    for old, new in zip(before, after, strict=True):
        assert new["in"] == math.ceil(old["in"] / 16)
        assert new["out"] == math.ceil(old["out"] / 16)
        assert new["hash_ids"] == old["hash_ids"][::16]
    # A prompt that extended the one before it still does.
    extended = [
        (a, b) for a, b in itertools.pairwise(before) if b["hash_ids"][: len(a["hash_ids"])] == a["hash_ids"]
    ]
    assert extended
    for a, b in extended:
        sa, sb = kvp.scale_requests([a], 16)[0], kvp.scale_requests([b], 16)[0]
        assert sb["hash_ids"][: len(sa["hash_ids"])] == sa["hash_ids"]


def _rec(session: str, t: float, prompt: int, ok: bool = True) -> dict:
    return {
        "session_id": session, "trace_id": session, "t_dispatch": t, "prompt_tokens": prompt,
        "status": "ok" if ok else "error", "accepted": ok, "phase": "profile",
    }  # fmt: skip


def test_the_working_set_is_what_live_sessions_hold(kvp) -> None:
    records = [
        _rec("a", 0.0, 100), _rec("b", 1.0, 300), _rec("a", 2.0, 200),  # a grows; both live
        _rec("c", 3.0, 50, ok=False),  # refused: holds nothing
        _rec("b", 4.0, 400),  # a never comes back after 2.0: freed
    ]  # fmt: skip
    # after each dispatch: 100, 400, 500, (c ignored), b 400 (a freed at its last request)
    assert kvp.working_set_tokens(records) == pytest.approx((100 + 400 + 500 + 400) / 4)
    with pytest.raises(kvp.InputError, match="no accepted request"):
        kvp.working_set_tokens([_rec("a", 0.0, 10, ok=False)])


def test_pools_put_the_working_set_at_each_ratio(kvp) -> None:
    assert kvp.pool_blocks(1000, 0.5, 10) == 2000
    assert kvp.pool_blocks(1000, 1.4, 10) == 715
    with pytest.raises(kvp.InputError, match=r"ratio 2\.0: a pool of 50 blocks cannot hold one request"):
        kvp.pool_blocks(100, 2.0, 64)


def _run(kvp, engine: str, ratio: float, hit: float | None, repeat: int = 1, evicted: float | None = None):  # type: ignore[no-untyped-def]
    return kvp.Run(
        engine, ratio, repeat, 100, "SUCCESS", hit, 0.0, 50, 80.0, f"{engine}-{ratio}", evicted_blocks=evicted
    )


def test_the_verdict_per_ratio(kvp) -> None:
    runs = [
        # 0.5: within 2 pp
        _run(kvp, "vllm", 0.5, 0.60, evicted=100), _run(kvp, "vllm", 0.5, 0.61, 2, 300),
        _run(kvp, "sim", 0.5, 0.62, evicted=250),
        # 1.0: 5 pp apart, but vLLM's own spread is 6 pp: within it
        _run(kvp, "vllm", 1.0, 0.30), _run(kvp, "vllm", 1.0, 0.36, 2), _run(kvp, "sim", 1.0, 0.38),
        # 1.4: close in points, but the simulator is past the cliff (below half of 0.62) and vLLM is not
        _run(kvp, "vllm", 1.4, 0.32), _run(kvp, "sim", 1.4, 0.305),
        # 2.0: far apart
        _run(kvp, "vllm", 2.0, 0.20), _run(kvp, "sim", 2.0, 0.05),
        # 0.7: vLLM gave no figure
        _run(kvp, "vllm", 0.7, None), _run(kvp, "sim", 0.7, 0.5),
    ]  # fmt: skip
    rows = {r.ratio: r for r in kvp.compare(runs, unpressured=0.62)}
    assert rows[0.5].ok and rows[0.5].gap_pp == pytest.approx(1.5)
    assert rows[1.0].ok and rows[1.0].limit_pp == pytest.approx(6.0)
    assert not rows[1.4].ok and rows[1.4].why == "vLLM before the cliff, the simulator past the cliff"
    assert not rows[2.0].ok and rows[2.0].why == "15.0 pp apart (limit 2.0)"
    assert not rows[0.7].ok and rows[0.7].why == "no hit rate from vLLM"
    text = kvp.markdown(list(rows.values()), 0.62, 231.0)
    assert "| 0.5 | 100 | 60.5% (1.0%, 2) | 62.0% (0.0%, 1) | 1.5 pp (2.0) |" in text
    assert "| 0.0 / 0.0 | 200 / 250 | 50.0 / 50.0 | ok |" in text  # preemptions, evictions, requests
    assert "| 0.0 / 0.0 | - / - | 50.0 / 50.0 |" in text  # a ratio without eviction counts


def test_vllms_evictions_come_from_whole_event_counts_only(kvp, tmp_path: Path) -> None:
    counts = {"removed_blocks": 1234, "whole": True}
    (tmp_path / "whole.json").write_text(json.dumps(counts))
    (tmp_path / "lost.json").write_text(json.dumps({**counts, "whole": False}))
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert kvp.evicted_from_events(tmp_path / "whole.json") == 1234
    assert kvp.evicted_from_events(tmp_path / "lost.json") is None  # a message lost: no figure
    assert kvp.evicted_from_events(tmp_path / "absent.json") is None
    with pytest.raises(kvp.InputError, match=r"junk\.json: not kv_events\.py's counts \(a list"):
        kvp.evicted_from_events(tmp_path / "junk.json")


def _timed(t: float, prompt: int, cached: int, ttft: float, tpot: float, ok: bool = True) -> dict:
    return {
        "t_dispatch": t, "t_done": t + ttft + 20 * tpot, "prompt_tokens": prompt, "cached_tokens": cached,
        "ttft_s": ttft, "tpot_s": tpot, "status": "ok" if ok else "error", "accepted": ok,
    }  # fmt: skip


def test_the_step_model_is_fitted_to_vllms_request_times(kvp) -> None:
    # A device with a = 10 ms a step, c = 2 ms per running sequence, b = 0.3 ms per prompt token not
    # served from the cache, and requests that wait 0.2 s - one step before the scheduler takes them.
    runs = []
    for _ in range(2):
        alone = [  # one every 2 s: TTFT = r + a + c + b * uncached, 12 ms per output token
            _timed(2.0 * i, 1000 + 97 * i, 64 * (i % 5), 0.2 + 3e-4 * (1000 + 97 * i - 64 * (i % 5)), 0.012)
            for i in range(20)
        ]
        # Two decoding side by side: a + 2c each.
        pair = [_timed(100.0, 1000, 0, 0.2, 0.014), _timed(100.0, 1000, 0, 0.2, 0.014)]
        # One decodes while another prefills (20 ms a token more), which then decodes alone.
        beside = [_timed(200.0, 1000, 0, 0.1, 0.032), _timed(200.1, 1000, 0, 0.7, 0.012)]
        refused = [_timed(300.0, 5000, 0, 99.0, 5.0, ok=False)]
        runs.append(alone + pair + beside + refused)
    assert [len(kvp.ran_alone(r)) for r in runs] == [20, 20]
    assert sorted(kvp.neighbours(runs[0]))[-3:] == [
        (0.014, 1.0, 0.0), (0.014, 1.0, 0.0), (0.032, 0.0, 1.0)
    ]  # fmt: skip
    fit = kvp.fitted_step_coefficients(runs)
    assert fit["b"] == pytest.approx(3e-4)
    assert fit["a"] == pytest.approx(0.010)
    assert fit["c"] == pytest.approx(0.002)
    assert fit["r"] == pytest.approx(0.2 - 0.012)  # TTFT's fixed part less the step that emits the token
    assert fit["a_p"] == 0.0
    assert kvp.coefficients_text(fit) == "a=0.01,a_p=0,b=0.0003,c=0.002,r=0.188"
    with pytest.raises(kvp.InputError, match=r"too few vLLM requests that ran alone .* \(20, need 30\)"):
        kvp.fitted_step_coefficients(runs[:1])


def _turn(session: str, t: float, done: float, prompt: int, cached: int, out: int, theo_blocks: int) -> dict:
    return {
        "session_id": session, "trace_id": session, "t_dispatch": t, "t_done": done, "prompt_tokens": prompt,
        "cached_tokens": cached, "output_tokens": out, "theoretical_hit_blocks": theo_blocks,
        "status": "ok", "accepted": True,
    }  # fmt: skip


def test_reuse_distance_is_what_others_allocated_while_a_session_was_idle(kvp) -> None:
    bs = kvp.BLOCK_SIZE
    records = [
        _turn("a", 0.0, 1.0, 10 * bs, 0, bs, 0),  # a's first turn: no distance
        _turn("b", 1.5, 2.0, 4 * bs, bs, bs // 2, 0),  # b allocates 3 + 1 (half a block of output) = 4
        _turn("c", 2.5, 3.0, 2 * bs, 0, 0, 0),  # c allocates 2
        _turn("a", 4.0, 5.0, 12 * bs, 8 * bs, bs, 10),  # a returns: b and c came while it was idle
        _turn("b", 4.5, 5.0, 6 * bs, 4 * bs, 0, 4),  # b returns: c (2) and a's second turn (4 + 1) came between
    ]  # fmt: skip
    assert kvp.returning_turns(records) == [(6.0, 8 * bs, 10 * bs), (7.0, 4 * bs, 4 * bs)]
    text = kvp.reuse_markdown(
        {(1.0, "vllm"): kvp.returning_turns(records), (1.0, "sim"): [(30.0, 0, bs)]}, {1.0: 20}
    )
    assert "| 1 | 0.25-0.5 | 2 | 85.7% | 0 | - |" in text  # 6/20 and 7/20 of the pool; (8 + 4) / (10 + 4)
    assert "| 1 | >= 1 | 0 | - | 1 | 0.0% |" in text


def _trace(path: Path, name: str, prompts: list[list[int]]) -> None:
    """A trace whose parent sends prompts of these hash ids (64 tokens each), 8 tokens out."""
    reqs = [
        {"t": float(i), "type": "n", "in": 64 * len(ids), "out": 8, "hash_ids": ids}
        for i, ids in enumerate(prompts)
    ]
    doc = {"id": name, "block_size": 64, "hash_id_scope": "local", "requests": reqs}
    (path / f"{name}.json").write_text(json.dumps(doc))


def _played(trace: str, turn: int, t: float, prompt: int, done: float, cached: int = 0) -> dict:
    return {
        "trace_id": trace, "session_id": trace, "turn": turn, "play": 0, "salt": "", "user": 0,
        "request_id": f"{trace}#{turn}", "t_dispatch": t, "ttft_s": 0.1, "t_done": done,
        "prompt_tokens": prompt, "output_tokens": 8, "cached_tokens": cached, "status": "ok", "accepted": True,
    }  # fmt: skip


def test_a_runs_timeline_replays_through_the_simulated_engines_cache(kvp, tmp_path: Path) -> None:
    """Session a's second turn extends its first (4 blocks + 4 new); session b's prompt (7 blocks) runs
    while a thinks. With room for both, a's second turn hits its 4 blocks. In a pool of 10, b takes 8
    (its prompt and the first token's slot): the 6 free and 2 of a's, evicted tail first, so a's second
    turn finds its first 2. Sent while a's first turn still runs, it hits the blocks that turn cached
    when it was scheduled."""
    import timeline_replay as tr

    _trace(tmp_path, "a", [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8]])
    _trace(tmp_path, "b", [[11, 12, 13, 14, 15, 16, 17]])
    index = tr.TraceIndex(tmp_path, 4096)
    a0, a1 = _played("a", 0, 0.0, 4 * 64, 1.0), _played("a", 1, 3.0, 8 * 64, 4.0)
    b0 = _played("b", 0, 1.5, 7 * 64, 2.5)
    assert index.prompt_blocks(a1, 64)[:4] == index.prompt_blocks(a0, 64)
    assert set(index.prompt_blocks(b0, 64)).isdisjoint(index.prompt_blocks(a1, 64))
    prompts = (4 + 8 + 7) * 64
    assert tr.replay_timeline([a0, b0, a1], index, 100, 64, 0.05) == (pytest.approx(4 * 64 / prompts), 0)
    # Evicted: b's 2 of a's blocks, then a's second turn (9 blocks, 2 hit) takes the 1 free and 6 cached
    assert tr.replay_timeline([a0, b0, a1], index, 10, 64, 0.05) == (pytest.approx(2 * 64 / prompts), 8)
    overlapping = _played("a", 1, 0.5, 8 * 64, 4.0)  # sent while turn 0 still ran: cached when scheduled
    assert tr.replay_timeline([a0, overlapping], index, 100, 64, 0.05).hit_rate == pytest.approx(
        4 * 64 / (12 * 64)
    )
    unknown = {**a0, "trace_id": "c", "session_id": "c"}
    with pytest.raises(KeyError, match="'c' is not among the run's traces"):
        tr.replay_timeline([unknown], index, 100, 64, 0.05)
