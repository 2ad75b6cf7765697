"""Request bodies, pre-encoded as bytes, from the trace library's synthesizer; plus theoretical hits.

Prompt modes (``PromptSynthesizer``): ``words`` (default: one word per token, for the simulated
engine), ``chat`` (``--tokenizer``: words calibrated to the served model's tokenizer) and ``ids``
(``--api completions``: token ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kv_cache_tester.replay.jsonfast import dumps
from kv_cache_tester.traces.cache import PrefixTracker
from kv_cache_tester.traces.model import Request, SubAgent, Trace
from kv_cache_tester.traces.synth import PlaySynth, PromptSynthesizer


@dataclass(slots=True)
class Scope:
    """One play of one trace (sub-agents share it)."""

    play: PlaySynth
    salt: str
    cache_scope: str
    local: bool


@dataclass(slots=True)
class Built:
    body: bytes
    expected_prompt_tokens: int
    hit_blocks: int
    total_blocks: int


def salt_for(trace: Trace, play: int) -> str:
    """First play: no salt (content matches the trace analysis). A replayed trace gets fresh content
    so it cannot hit its own earlier play in the server cache. Global-scope datasets keep one salt
    for the run, or their intended cross-trace sharing would be lost."""
    if play == 0 or trace.hash_id_scope == "global":
        return ""
    return f"p{play}"


class PayloadBuilder:
    def __init__(
        self,
        *,
        api: str,
        model: str,
        seed: int,
        ignore_eos: bool,
        send_max_tokens: bool,
        mode: str = "words",
        tokenizer: Any = None,
    ) -> None:
        self.api = api
        self.mode = mode
        self.synth = PromptSynthesizer(mode=mode, seed=seed, tokenizer=tokenizer)  # type: ignore[arg-type]
        self.tracker = PrefixTracker()
        self._head = b'{"model":' + dumps(model)
        self._tail_fixed = b',"stream":true,"stream_options":{"include_usage":true}' + (
            b',"ignore_eos":true' if ignore_eos else b""
        )
        self._send_max_tokens = send_max_tokens

    def open_scope(self, trace: Trace, play: int) -> Scope:
        salt = salt_for(trace, play)
        ps = self.synth.start_play(trace, salt)
        return Scope(play=ps, salt=salt, cache_scope=ps.cache_scope, local=trace.hash_id_scope != "global")

    def close_scope(self, scope: Scope) -> None:
        """Forget a finished play's blocks (bounded memory); global scopes live for the run."""
        if scope.local:
            self.tracker.forget(scope.cache_scope)

    def build(self, scope: Scope, agent: SubAgent | None, req: Request) -> Built:
        p = scope.play.prompt(req, agent)
        if self.api == "chat":
            parts = [self._head, b',"messages":[{"role":"user","content":', dumps(p.prompt_text), b"}]"]
        elif p.token_ids is not None:
            parts = [self._head, b',"prompt":', dumps(p.token_ids)]
        else:
            parts = [self._head, b',"prompt":', dumps(p.prompt_text)]
        parts.append(self._tail_fixed)
        if self._send_max_tokens:
            parts.append(b',"max_tokens":%d' % max(1, req.out_tokens))
        parts.append(b"}")
        body = b"".join(parts)  # one copy of the (often 100+ KB) prompt, not one per concatenation
        hits = self.tracker.observe(req.hash_ids, scope.cache_scope)
        return Built(body, p.expected_prompt_tokens, hits, len(req.hash_ids))
