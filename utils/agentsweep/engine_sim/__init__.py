"""The simulated engine: a GPU-free vLLM/SGLang stand-in with a paged prefix cache and a CPU tier.

Modules: ``tokenizer`` (word-level tokens, chat template), ``prompt_memo`` (a session's prompt by its
new part), ``profiles`` (hardware x model figures and the step-time model), ``kv_cache`` and
``cpu_tier`` (paged blocks, LRU, offload tier), ``request`` (one request's state and timeline),
``scheduler`` (continuous batching on a simulated clock), ``disagg`` (prefill and decode roles: the
handoff protocols and their part inside the engine), ``stats`` and ``metrics`` (Prometheus dialects),
``faults``, ``server`` (HTTP routes) and ``sse`` (streamed responses), ``cli``
(``agentsweep engine-sim``).
"""
