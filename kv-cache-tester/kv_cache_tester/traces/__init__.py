"""The trace library: loading, validation, prompt synthesis and cache analysis.

Main entry points (import from the submodules or from here)::

    from kv_cache_tester.traces import load_traces, PromptSynthesizer, PrefixTracker
"""

from kv_cache_tester.traces.cache import LRUPrefixCache, PrefixTracker
from kv_cache_tester.traces.filters import FilterReport
from kv_cache_tester.traces.loaders import LoadResult, iter_traces, load_traces
from kv_cache_tester.traces.model import Request, SubAgent, SubAgentGroup, Trace
from kv_cache_tester.traces.synth import PlaySynth, PromptSynthesizer, SynthPrompt

__all__ = [
    "FilterReport",
    "LRUPrefixCache",
    "LoadResult",
    "PlaySynth",
    "PrefixTracker",
    "PromptSynthesizer",
    "Request",
    "SubAgent",
    "SubAgentGroup",
    "SynthPrompt",
    "Trace",
    "iter_traces",
    "load_traces",
]
