"""Dataset filters (--max-context, --min-requests), always reported with counts, never silent.

``max_context`` modes:

* ``drop``: a trace with any request (sub-agents included) over ``max_context`` tokens is dropped whole.
* ``truncate``: the parent timeline is cut before its first request over the limit (sub-agent groups
  after the cut go too, the group just before it stays as the trace's last step), and each remaining
  sub-agent is cut before its own first request over the limit. A trace left with no request is dropped.

``min_requests`` then drops traces with fewer requests (parent and sub-agents) than the minimum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kv_cache_tester.traces.model import SubAgentGroup, Trace

MaxContextMode = Literal["drop", "truncate"]


@dataclass(slots=True)
class FilterReport:
    """What the filters did. ``lines()`` is what a command prints; ``to_dict()`` goes into JSON."""

    traces_in: int = 0
    requests_in: int = 0
    traces_out: int = 0
    requests_out: int = 0
    max_context: int | None = None
    max_context_mode: MaxContextMode = "drop"
    min_requests: int = 1
    dropped_max_context: list[str] = field(default_factory=list)  # trace ids
    truncated: dict[str, int] = field(default_factory=dict)  # trace id -> requests removed
    dropped_min_requests: list[str] = field(default_factory=list)
    renamed_duplicates: dict[str, str] = field(default_factory=dict)  # new id -> original id
    skipped_links: list[str] = field(default_factory=list)  # "path (why)", links not followed

    @property
    def changed(self) -> bool:
        return bool(self.dropped_max_context or self.truncated or self.dropped_min_requests)

    def lines(self) -> list[str]:
        out = [
            f"loaded {self.traces_in} traces ({self.requests_in} requests); "
            f"kept {self.traces_out} traces ({self.requests_out} requests)"
        ]
        if self.max_context is not None:
            if self.max_context_mode == "drop":
                out.append(
                    f"max_context {self.max_context} (drop): dropped {len(self.dropped_max_context)} traces"
                    + (f": {', '.join(self.dropped_max_context[:10])}" if self.dropped_max_context else "")
                    + (" ..." if len(self.dropped_max_context) > 10 else "")
                )
            else:
                removed = sum(self.truncated.values())
                out.append(
                    f"max_context {self.max_context} (truncate): truncated {len(self.truncated)} traces, "
                    f"removed {removed} requests; dropped {len(self.dropped_max_context)} traces left empty"
                )
        if self.dropped_min_requests:
            out.append(
                f"min_requests {self.min_requests}: dropped {len(self.dropped_min_requests)} traces"
                f" with fewer requests"
            )
        if self.renamed_duplicates:
            out.append(f"renamed {len(self.renamed_duplicates)} duplicate trace ids (suffix ~N)")
        if self.skipped_links:
            out.append(
                f"skipped {len(self.skipped_links)} symbolic links (followed only to files inside the "
                f"directory given): {', '.join(self.skipped_links[:5])}"
                + (" ..." if len(self.skipped_links) > 5 else "")
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "traces_in": self.traces_in,
            "requests_in": self.requests_in,
            "traces_out": self.traces_out,
            "requests_out": self.requests_out,
            "max_context": self.max_context,
            "max_context_mode": self.max_context_mode,
            "min_requests": self.min_requests,
            "dropped_max_context": list(self.dropped_max_context),
            "truncated": dict(self.truncated),
            "dropped_min_requests": list(self.dropped_min_requests),
            "renamed_duplicates": dict(self.renamed_duplicates),
            "skipped_links": list(self.skipped_links),
        }


def max_in(trace: Trace) -> int:
    return max((r.in_tokens for r in trace.all_requests()), default=0)


def truncate_trace(trace: Trace, max_context: int) -> int:
    """Cut ``trace`` in place (see module doc); returns how many requests were removed."""
    before = trace.num_requests
    cut = next((r.index for r in trace.requests if r.in_tokens > max_context), len(trace.requests))
    del trace.requests[cut:]
    kept: list[SubAgentGroup] = []
    for group in trace.groups:
        if group.join_index > cut:
            continue
        for agent in group.agents:
            stop = next((j for j, r in enumerate(agent.requests) if r.in_tokens > max_context), None)
            if stop is not None:
                del agent.requests[stop:]
        group.agents = [a for a in group.agents if a.requests]
        if group.agents:
            kept.append(group)
    trace.groups = kept
    return before - trace.num_requests


def apply_filters(
    traces: list[Trace],
    report: FilterReport,
    *,
    max_context: int | None,
    max_context_mode: MaxContextMode,
    min_requests: int,
) -> list[Trace]:
    report.max_context = max_context
    report.max_context_mode = max_context_mode
    report.min_requests = min_requests
    kept: list[Trace] = []
    for trace in traces:
        if max_context is not None and max_in(trace) > max_context:
            if max_context_mode == "drop":
                report.dropped_max_context.append(trace.trace_id)
                continue
            removed = truncate_trace(trace, max_context)
            report.truncated[trace.trace_id] = removed
            if trace.num_requests == 0:
                report.dropped_max_context.append(trace.trace_id)
                continue
        if trace.num_requests < min_requests:
            report.dropped_min_requests.append(trace.trace_id)
            continue
        kept.append(trace)
    report.traces_out = len(kept)
    report.requests_out = sum(t.num_requests for t in kept)
    return kept
