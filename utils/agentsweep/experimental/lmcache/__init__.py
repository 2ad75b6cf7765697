"""LMCache agentic traces (Hugging Face sammshen/lmcache-agentic-traces) for AIPerf and the replayer.

Run ``python -m agentsweep.experimental.lmcache --help``.
"""

from agentsweep.experimental.lmcache.convert import BlockHasher, ConvertReport, convert

__all__ = ["BlockHasher", "ConvertReport", "convert"]
