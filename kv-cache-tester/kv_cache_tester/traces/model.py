"""The normalized trace model every loader produces and every consumer reads.

A trace is one agentic session: a timeline of parent requests, with sub-agent groups between them.
Consecutive sub-agent entries in a source file form one group (a parallel fan-out); the parent's next
request joins the group (waits for all of its sub-agents).

Hash ids identify prompt blocks of ``block_size`` tokens. With scope "local" ids are per trace and
sub-agents share their parent's ids; with scope "global" ids are shared by the whole dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

HashScope = Literal["local", "global"]


@dataclass(slots=True)
class Request:
    """One model call, as recorded."""

    index: int  # position among its owner's requests (parent or one sub-agent), from 0
    t: float  # seconds since the owner's start (session start, or the sub-agent's spawn)
    in_tokens: int  # prompt tokens
    out_tokens: int  # generated tokens
    hash_ids: list[int]  # one id per prompt block (full blocks, plus a partial tail in weka layout)
    think_time: float = 0.0  # gap before this request, end of previous response -> this start
    api_time: float = 0.0  # recorded server time of this request
    ttft: float | None = None  # recorded time to first token, when the source has it
    model: str | None = None

    def full_blocks(self, block_size: int) -> int:
        """Number of whole ``block_size`` blocks among this request's hash ids."""
        return min(len(self.hash_ids), self.in_tokens // block_size)


@dataclass(slots=True)
class SubAgent:
    """One sub-agent of a fan-out: its own session, in its parent trace's hash-id scope."""

    agent_id: str
    requests: list[Request]
    subagent_type: str = ""
    t: float = 0.0  # spawn time, seconds since the parent session start
    tool_tokens: int = 0
    system_tokens: int = 0


@dataclass(slots=True)
class SubAgentGroup:
    """Sub-agents spawned together; the parent request at ``join_index`` waits for all of them.

    ``join_index`` is the index of the parent request that follows the group (== number of parent
    requests when the group is the trace's last step).
    """

    join_index: int
    agents: list[SubAgent]


@dataclass(slots=True)
class Trace:
    trace_id: str
    source: str  # file (or dataset row) it came from, for error messages
    block_size: int
    hash_id_scope: HashScope
    requests: list[Request]  # the parent's requests, in order
    groups: list[SubAgentGroup] = field(default_factory=list)  # ordered by join_index
    tool_tokens: int = 0
    system_tokens: int = 0
    models: list[str] = field(default_factory=list)
    dataset: str = ""  # name of the dataset the trace came from; the content scope of "global" ids
    t0: float = 0.0  # session start in dataset time (s); 0 unless the source has arrival times

    @property
    def scope_key(self) -> str:
        """Key of the content scope of this trace's hash ids (sub-agents share it)."""
        if self.hash_id_scope == "global":
            return f"dataset:{self.dataset}"
        return f"trace:{self.trace_id}"

    def steps(self) -> Iterator[Request | SubAgentGroup]:
        """The parent's timeline: requests and groups in order (a group before the request joining it)."""
        gi = 0
        for req in self.requests:
            while gi < len(self.groups) and self.groups[gi].join_index <= req.index:
                yield self.groups[gi]
                gi += 1
            yield req
        yield from self.groups[gi:]

    def all_requests(self) -> Iterator[Request]:
        """Every request, parent and sub-agents, in timeline order."""
        for step in self.steps():
            if isinstance(step, SubAgentGroup):
                for agent in step.agents:
                    yield from agent.requests
            else:
                yield step

    @property
    def num_requests(self) -> int:
        return len(self.requests) + sum(len(a.requests) for g in self.groups for a in g.agents)

    def timeline(self) -> Iterator[tuple[float, SubAgent | None, Request]]:
        """Every request with its start in session time (s) and its sub-agent (None for the parent).

        Order is the trace's own order (parent steps; a group's agents one after the other), not sorted.
        """
        for step in self.steps():
            if isinstance(step, SubAgentGroup):
                for agent in step.agents:
                    for req in agent.requests:
                        yield agent.t + req.t, agent, req
            else:
                yield step.t, None, step
