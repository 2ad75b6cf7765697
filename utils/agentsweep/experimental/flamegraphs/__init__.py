"""Per-trace cache flamegraphs from a cell's requests.jsonl (``python -m agentsweep.experimental.flamegraphs``)."""

from agentsweep.experimental.flamegraphs.render import load_requests, render

__all__ = ["load_requests", "render"]
