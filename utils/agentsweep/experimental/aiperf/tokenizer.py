"""A local word-level tokenizer directory for AIPerf runs against the simulated engine.

AIPerf synthesizes prompts from hash ids by sampling tokens of a text corpus and decoding them, so it
needs a tokenizer; its default downloads one at run time, which fails offline. The simulated engine
counts one whitespace-separated word as one token, so a word-level tokenizer whose vocabulary is the
corpus's words makes AIPerf's token counts and the engine's agree exactly (decode joins tokens with
single spaces; no text clean-up that would merge words).

The directory holds ``tokenizer.json`` + ``tokenizer_config.json`` (``PreTrainedTokenizerFast``), which
``transformers.AutoTokenizer`` loads from a path. AIPerf treats every tokenizer name as a hub id when
``HF_HUB_OFFLINE`` is set, so the runner unsets it for a local directory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from agentsweep.errors import InputError, RunError

FORMAT_VERSION = 1
UNK = "[UNK]"


def _words(files: Iterable[Path]) -> list[str]:
    seen: dict[str, None] = {}
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise InputError(f"{path}: cannot read the tokenizer corpus: {err.strerror or err}") from None
        for word in text.split():
            seen.setdefault(word, None)
    return list(seen)


def build_word_tokenizer(corpus_files: list[Path], out_dir: Path) -> Path:
    """Write (or reuse) a word-level tokenizer directory whose vocabulary is the corpus's words.

    The directory is reused when its stamp matches the corpus bytes and FORMAT_VERSION.
    """
    digest = hashlib.sha256(f"v{FORMAT_VERSION}".encode())
    for path in corpus_files:
        digest.update(path.read_bytes())
    stamp = digest.hexdigest()
    stamp_file = out_dir / "agentsweep-stamp.txt"
    if stamp_file.is_file() and stamp_file.read_text().strip() == stamp:
        return out_dir
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:  # pragma: no cover - depends on the environment
        raise RunError("building the local tokenizer needs the tokenizers package") from None
    vocab = {UNK: 0}
    for word in _words(corpus_files):
        vocab.setdefault(word, len(vocab))
    if len(vocab) < 2:
        raise InputError(f"{', '.join(map(str, corpus_files))}: the tokenizer corpus has no words")
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps({"unk_token": UNK}) + "\n")
    stamp_file.write_text(stamp + "\n")
    return out_dir
