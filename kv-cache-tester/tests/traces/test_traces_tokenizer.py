"""Chat and ids modes with a real byte-level BPE tokenizer trained on the fly (no download)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from kv_cache_tester.errors import UsageError
from kv_cache_tester.traces import PromptSynthesizer, Trace, load_traces
from kv_cache_tester.traces.synth import calibrate_vocabulary, load_tokenizer

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    words = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(1200)})
    lines = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    folder = tmp_path_factory.mktemp("tok")
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def trace(sample_traces_dir: Path) -> Trace:
    return load_traces(sample_traces_dir / "trace_0291.json").traces[0]


@pytest.fixture(scope="module")
def sample_traces_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "sample_traces"


def _count(tok: object, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)  # type: ignore[attr-defined]


def test_every_block_is_exactly_block_size_tokens(tokenizer_dir: Path, trace: Trace) -> None:
    tok = load_tokenizer(tokenizer_dir)
    synth = PromptSynthesizer("chat", seed=5, tokenizer=tokenizer_dir)
    play = synth.start_play(trace, "salt")
    ids = sorted({h for _, _, r in trace.timeline() for h in r.hash_ids})[::7]
    assert len(ids) > 200
    for hid in ids:
        block = play.block(hid)
        assert block.startswith(" ")
        assert _count(tok, block) == trace.block_size
    # adjacent blocks never merge: a run of blocks is exactly the sum
    run = "".join(play.block(h) for h in ids[:50])
    assert _count(tok, run) == 50 * trace.block_size


def test_whole_prompt_token_count_equals_in(tokenizer_dir: Path, trace: Trace) -> None:
    tok = load_tokenizer(tokenizer_dir)
    synth = PromptSynthesizer("chat", seed=5, tokenizer=tok, split_system=True)
    play = synth.start_play(trace, "salt")
    agents = [a for g in trace.groups for a in g.agents]
    picks = [(None, trace.requests[0]), (None, trace.requests[1]), (agents[0], agents[0].requests[0])]
    for agent, req in picks:
        p = play.prompt(req, agent)
        # documented overhead for the content itself: zero (the chat template is the server's)
        assert _count(tok, p.prompt_text) == req.in_tokens == p.expected_prompt_tokens
        assert p.system is not None and _count(tok, p.system) + _count(tok, p.text or "") == req.in_tokens


def test_ids_mode_with_tokenizer_matches_chat_text(tokenizer_dir: Path, trace: Trace) -> None:
    tok = load_tokenizer(tokenizer_dir)
    chat = PromptSynthesizer("chat", seed=1, tokenizer=tok).start_play(trace, "a")
    ids = PromptSynthesizer("ids", seed=1, tokenizer=tok).start_play(trace, "a")
    req = trace.requests[0]
    token_ids = ids.prompt(req).token_ids
    assert token_ids == tok.encode(chat.prompt(req).text, add_special_tokens=False).ids
    assert len(token_ids) == req.in_tokens


def test_calibration_is_deterministic_and_rejects_tiny_vocab(tokenizer_dir: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = load_tokenizer(tokenizer_dir)
    assert calibrate_vocabulary(tok) == calibrate_vocabulary(load_tokenizer(tokenizer_dir / "tokenizer.json"))
    tiny = Tokenizer(models.BPE())
    tiny.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    with pytest.raises(UsageError, match="usable single-token words"):
        calibrate_vocabulary(tiny)


def test_missing_tokenizer_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError, match=r"tokenizer nobody/nothing: not a local tokenizer\.json"):
        PromptSynthesizer("chat", tokenizer="nobody/nothing")
