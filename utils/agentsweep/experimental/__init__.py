"""Alternate client paths kept beside the main one (docs: docs/experimental.md).

* ``agentsweep.experimental.aiperf``: drive a cell with AIPerf instead of kv-cache-tester replay;
* ``agentsweep.experimental.lmcache``: convert LMCache agentic traces (parquet) for AIPerf and the replayer;
* ``agentsweep.experimental.flamegraphs``: per-trace cache icicle charts from a cell's requests.jsonl.
"""
