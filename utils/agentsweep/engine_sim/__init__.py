"""The simulated engine: a GPU-free vLLM/SGLang stand-in with a paged prefix cache and a CPU tier.

Modules: ``tokenizer`` (word-level tokens, chat template), ``profiles`` (hardware x model figures and
the step-time model), ``kv_cache`` (paged blocks, LRU, offload tier), ``scheduler`` (continuous
batching on a simulated clock), ``metrics`` (Prometheus dialects), ``faults``, ``server`` (HTTP),
``cli`` (``agentsweep engine-sim``).
"""
