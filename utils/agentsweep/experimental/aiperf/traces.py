"""Our traces as AIPerf input, plus the index that maps AIPerf's records back to trace requests.

* Traces with local hash ids (the kv-cache-tester / weka corpus) go through AIPerf's ``weka_trace``
  loader: one JSON file per trace, sub-agent groups kept (AIPerf spawns and joins them).
* Traces with global hash ids (mooncake sources, converted LMCache sessions) go through its
  ``mooncake_trace`` loader: one conversation per session (a sub-agent becomes its own conversation),
  ``delay`` in ms before each later turn, ``hash_ids`` shared across the file as in the source.

Both are written with the cell's timing applied: think times capped at ``max_delay`` and every
time multiplied by ``time_scale`` (1/speed of the simulated engine); requests over ``max_context``
are cut as the replayer cuts them (truncate mode).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kv_cache_tester.errors import TraceError
from kv_cache_tester.traces.loaders import load_traces
from kv_cache_tester.traces.model import Request, SubAgent, Trace

from agentsweep.errors import InputError

SUBAGENT_MARK = "::sa:"  # AIPerf's conversation id of a weka sub-agent: <trace>::sa:<agent>


@dataclass(slots=True)
class TurnInfo:
    trace_id: str
    session_id: str  # our naming: trace, or trace:agent
    turn: int
    in_tokens: int
    out_tokens: int
    hash_ids: list[int]
    scope: str


@dataclass
class PreparedInput:
    dataset_type: str  # AIPerf --custom-dataset-type
    path: Path  # AIPerf --input-file
    block_size: int
    turns: dict[tuple[str, int], TurnInfo] = field(default_factory=dict)  # (conversation, turn) -> info
    traces: int = 0
    requests: int = 0

    def lookup(self, conversation_id: str, turn_index: int) -> TurnInfo | None:
        return self.turns.get((conversation_id, turn_index))


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else round(value * scale, 6)


def _think(req: Request, scale: float, max_delay: float | None) -> float:
    gap = req.think_time if max_delay is None else min(req.think_time, max_delay)
    return round(gap * scale, 6)


def _weka_request(
    req: Request, offset: float, scale: float, max_delay: float | None, model: str
) -> dict[str, Any]:
    return {
        "t": round((offset + req.t) * scale, 6),
        "type": "n",
        "model": req.model or model,
        "in": req.in_tokens,
        "out": req.out_tokens,
        "hash_ids": req.hash_ids,
        "api_time": _scaled(req.api_time, scale),
        "think_time": _think(req, scale, max_delay),
    }


def weka_object(trace: Trace, *, scale: float, max_delay: float | None) -> dict[str, Any]:
    """One local-scope trace as a weka_trace object (sub-agent request times absolute, as AIPerf reads them)."""
    model = trace.models[0] if trace.models else "unknown"
    entries: list[dict[str, Any]] = []
    for step in trace.steps():
        if isinstance(step, Request):
            entries.append(_weka_request(step, 0.0, scale, max_delay, model))
            continue
        for agent in step.agents:
            entries.append(
                {
                    "t": round(agent.t * scale, 6),
                    "type": "subagent",
                    "agent_id": agent.agent_id,
                    "subagent_type": agent.subagent_type or "agent",
                    "status": "completed",
                    "models": sorted({r.model or model for r in agent.requests}),
                    "tool_tokens": agent.tool_tokens,
                    "system_tokens": agent.system_tokens,
                    "requests": [_weka_request(r, agent.t, scale, max_delay, model) for r in agent.requests],
                }
            )
    return {
        "id": trace.trace_id,
        "models": trace.models or [model],
        "block_size": trace.block_size,
        "hash_id_scope": "local",
        "tool_tokens": trace.tool_tokens,
        "system_tokens": trace.system_tokens,
        "requests": entries,
    }


def _sessions(trace: Trace) -> list[tuple[str, str, SubAgent | None, list[Request]]]:
    """(AIPerf conversation id, our session id, agent, requests) of a trace."""
    out: list[tuple[str, str, SubAgent | None, list[Request]]] = [
        (trace.trace_id, trace.trace_id, None, trace.requests)
    ]
    for group in trace.groups:
        for agent in group.agents:
            out.append(
                (
                    f"{trace.trace_id}{SUBAGENT_MARK}{agent.agent_id}",
                    f"{trace.trace_id}:{agent.agent_id}",
                    agent,
                    agent.requests,
                )
            )
    return [s for s in out if s[3]]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:100] or "trace"


def prepare_input(
    source: str | Path,
    work_dir: Path,
    *,
    time_scale: float = 1.0,
    max_delay: float | None = None,
    max_context: int | None = None,
    fmt: str = "auto",
) -> PreparedInput:
    """Write the cell's traces as AIPerf input under ``work_dir``; ``fmt``: auto | weka | mooncake."""
    if fmt not in ("auto", "weka", "mooncake"):
        raise InputError(f"--format: expected auto, weka or mooncake, got {fmt!r}")
    try:
        loaded = load_traces(source, max_context=max_context or None, max_context_mode="truncate")
    except TraceError as err:
        raise InputError(str(err)) from None
    traces = loaded.traces
    sizes = {t.block_size for t in traces}
    if len(sizes) > 1:
        raise InputError(f"{source}: traces mix block sizes {sorted(sizes)}; AIPerf takes one")
    block_size = sizes.pop()
    local = all(t.hash_id_scope == "local" for t in traces)
    if fmt == "auto":
        fmt = "weka" if local else "mooncake"
    if fmt == "weka" and not local:
        raise InputError(f"{source}: AIPerf's weka_trace loader takes only local hash ids; use mooncake")
    work_dir.mkdir(parents=True, exist_ok=True)
    prepared = PreparedInput(
        dataset_type="weka-trace" if fmt == "weka" else "mooncake-trace",
        path=work_dir / ("weka" if fmt == "weka" else "mooncake_trace.jsonl"),
        block_size=block_size,
        traces=len(traces),
    )
    for trace in traces:
        for conv, session, _agent, reqs in _sessions(trace):
            for req in reqs:
                prepared.turns[(conv, req.index)] = TurnInfo(
                    trace.trace_id,
                    session,
                    req.index,
                    req.in_tokens,
                    req.out_tokens,
                    req.hash_ids,
                    trace.scope_key,
                )
                prepared.requests += 1
    if fmt == "weka":
        prepared.path.mkdir(parents=True, exist_ok=True)
        for old in prepared.path.glob("*.json"):
            old.unlink()
        for k, trace in enumerate(traces):
            obj = weka_object(trace, scale=time_scale, max_delay=max_delay)
            (prepared.path / f"{k:05d}_{_safe(trace.trace_id)}.json").write_text(json.dumps(obj))
        return prepared
    with open(prepared.path, "w", encoding="utf-8") as fh:
        for k, trace in enumerate(traces):
            # local ids of different traces must not meet in AIPerf's file-wide block cache
            base = (k + 1) << 32 if trace.hash_id_scope == "local" else 0
            for conv, _session, _agent, reqs in _sessions(trace):
                for j, req in enumerate(reqs):
                    row: dict[str, Any] = {
                        "session_id": conv,
                        "input_length": req.in_tokens,
                        "output_length": req.out_tokens,
                        "hash_ids": [base | h for h in req.hash_ids],
                    }
                    if j > 0:
                        row["delay"] = round(_think(req, time_scale, max_delay) * 1000.0, 3)
                    fh.write(json.dumps(row) + "\n")
    return prepared
