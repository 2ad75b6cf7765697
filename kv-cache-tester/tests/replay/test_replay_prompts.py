"""Request bodies: the JSON of the synthesized prompt, whatever the encoding shortcuts."""

from __future__ import annotations

import json

import pytest
from kv_cache_tester.replay.prompts import PayloadBuilder
from kv_cache_tester.traces import PromptSynthesizer, SubAgentGroup, load_traces


@pytest.mark.parametrize(
    ("api", "mode"), [("chat", "words"), ("completions", "words"), ("completions", "ids")]
)
def test_every_body_carries_exactly_its_prompt(sample_traces, api, mode):
    vocab = 4096 if mode == "ids" else None
    builder = PayloadBuilder(
        api=api, model="m", seed=5, ignore_eos=True, send_max_tokens=True, mode=mode, vocab_size=vocab
    )
    reference = PromptSynthesizer(mode=mode, seed=5)
    reference.vocab = builder.synth.vocab
    checked = 0
    for trace in load_traces(sample_traces / "trace_0291.json").traces:
        for play in (0, 1):
            scope = builder.open_scope(trace, play)
            ref = reference.start_play(trace, scope.salt)
            for step in trace.steps():
                pairs = (
                    [(a, r) for a in step.agents for r in a.requests]
                    if isinstance(step, SubAgentGroup)
                    else [(None, step)]
                )
                for agent, req in pairs:
                    body = json.loads(builder.build(scope, agent, req).body)
                    sent = body["messages"][0]["content"] if api == "chat" else body["prompt"]
                    expected = ref.prompt(req, agent)
                    assert sent == (expected.token_ids if mode == "ids" else expected.prompt_text)
                    assert body["max_tokens"] == max(1, req.out_tokens) and body["stream"] is True
                    checked += 1
            builder.close_scope(scope)
    assert checked > 50
