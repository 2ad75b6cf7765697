"""Turn parsed JSON (kv-cache-tester / weka trace objects, mooncake rows) into the trace model.

Every problem raises :class:`TraceError` with one line:
``<source>: request <i>: <field>: <what>`` (``<i>`` is the entry's index in the file's ``requests``;
a sub-agent's request is ``<entry>.<j>``), or ``<source>: <field>: <what>`` for trace-level fields.

Both hash-id layouts are accepted: ids from 1 with one id per whole block (``len == in // bs``), and the
weka layout (ids from 0, ``len == ceil(in / bs)``, the last id naming the partial tail block). More ids
than ``ceil(in / bs)`` is an error.
"""

from __future__ import annotations

from typing import Any

from kv_cache_tester.errors import TraceError
from kv_cache_tester.traces.model import Request, SubAgent, SubAgentGroup, Trace

SCOPES = ("local", "global")
MAX_TOKENS = 2**31 - 1  # far above any context length; beyond it a count is a corrupt value
MAX_SECONDS = 1e9  # about 31 years: times beyond it overflow waits (threading.TIMEOUT_MAX is ~9.2e9)
MAX_HASH_ID = 2**63 - 1  # ids are kept in 64-bit integer arrays


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _RequestParser:
    """Parses one owner's (parent or sub-agent) requests, sharing int objects between prefixes."""

    def __init__(self, source: str, block_size: int) -> None:
        self.source = source
        self.block_size = block_size
        self.prev_ids: list[int] = []

    def fail(self, label: str, fld: str, what: str) -> TraceError:
        return TraceError(f"{self.source}: request {label}: {fld}: {what}")

    def int_field(self, raw: dict[str, Any], label: str, fld: str, *, minimum: int) -> int:
        if fld not in raw:
            raise self.fail(label, fld, "missing")
        value = raw[fld]
        if type(value) is not int:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise self.fail(label, fld, f"must be an integer, got {_describe(value)}")
        if value < minimum:
            kind = "a positive" if minimum == 1 else "a non-negative"
            raise self.fail(label, fld, f"must be {kind} integer, got {value}")
        if value > MAX_TOKENS:  # 1e308 is an integral float: it would ask for a prompt of 10**308 tokens
            raise self.fail(label, fld, f"must be at most {MAX_TOKENS} tokens, got {_describe(value)}")
        return value

    def float_field(self, raw: dict[str, Any], label: str, fld: str, *, required: bool) -> float | None:
        if fld not in raw or raw[fld] is None:
            if required:
                raise self.fail(label, fld, "missing")
            return None
        value = raw[fld]
        if type(value) not in (int, float) or value != value or value in (float("inf"), float("-inf")):
            raise self.fail(label, fld, f"must be a number, got {_describe(value)}")
        if value < 0:
            raise self.fail(label, fld, f"must be >= 0, got {value}")
        limit = MAX_SECONDS * 1000 if fld == "timestamp" else MAX_SECONDS  # mooncake stamps are ms
        if value > limit:
            raise self.fail(label, fld, f"must be at most {limit:g}, got {_describe(value)}")
        return float(value)

    def hash_ids(self, raw: dict[str, Any], label: str, in_tokens: int) -> list[int]:
        if "hash_ids" not in raw:
            raise self.fail(label, "hash_ids", "missing")
        ids = raw["hash_ids"]
        if not isinstance(ids, list):
            raise self.fail(label, "hash_ids", f"must be a list of integers, got {_describe(ids)}")
        limit = -(-in_tokens // self.block_size)
        if len(ids) > limit:
            raise self.fail(
                label,
                "hash_ids",
                f"{len(ids)} ids for {in_tokens} tokens (at most {limit} blocks of {self.block_size})",
            )
        prev = self.prev_ids
        # Consecutive requests mostly extend each other: reuse the previous list's int objects for
        # the common prefix (memory), and validate only the new part (speed).
        n = len(prev)
        if len(ids) >= n and ids[:n] == prev:
            common = n
        else:
            lo, hi = 0, min(n, len(ids))
            while lo < hi:  # largest common prefix length, by slice comparison in C
                mid = (lo + hi + 1) // 2
                if ids[:mid] == prev[:mid]:
                    lo = mid
                else:
                    hi = mid - 1
            common = lo
        tail = ids[common:]
        for pos, value in enumerate(tail, start=common):
            if type(value) is not int or value < 0 or value > MAX_HASH_ID:
                raise self.fail(
                    label,
                    "hash_ids",
                    f"item {pos} must be an integer from 0 to 2**63-1, got {_describe(value)}",
                )
        result = prev[:common] + tail if common else tail
        self.prev_ids = result
        return result

    def request(self, raw: Any, label: str, index: int) -> Request:
        if not isinstance(raw, dict):
            raise TraceError(f"{self.source}: request {label}: must be an object, got {_describe(raw)}")
        in_tokens = self.int_field(raw, label, "in", minimum=1)
        out_tokens = self.int_field(raw, label, "out", minimum=0)
        t = self.float_field(raw, label, "t", required=True)
        model = raw.get("model")
        if model is not None and not isinstance(model, str):
            raise self.fail(label, "model", f"must be a string, got {_describe(model)}")
        return Request(
            index=index,
            t=t or 0.0,
            in_tokens=in_tokens,
            out_tokens=out_tokens,
            hash_ids=self.hash_ids(raw, label, in_tokens),
            think_time=self.float_field(raw, label, "think_time", required=False) or 0.0,
            api_time=self.float_field(raw, label, "api_time", required=False) or 0.0,
            ttft=self.float_field(raw, label, "ttft", required=False),
            model=model,
        )


def _trace_int(obj: dict[str, Any], source: str, fld: str, default: int, minimum: int) -> int:
    value = obj.get(fld, default)
    if value is None:
        value = default
    if type(value) is not int or value < minimum or value > MAX_TOKENS:
        raise TraceError(
            f"{source}: {fld}: must be an integer from {minimum} to {MAX_TOKENS}, got {_describe(value)}"
        )
    return value


def parse_trace(obj: Any, source: str, *, default_id: str, dataset: str = "") -> Trace:
    """Build a :class:`Trace` from one kv-cache-tester / weka trace object."""
    if not isinstance(obj, dict):
        raise TraceError(f"{source}: not a trace object (expected a JSON object with 'requests')")
    raw_id = obj.get("id", default_id)
    if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or raw_id == "":
        raise TraceError(f"{source}: id: must be a non-empty string, got {_describe(raw_id)}")
    block_size = _trace_int(obj, source, "block_size", 64, 1)
    scope = obj.get("hash_id_scope", "local")
    if scope not in SCOPES:
        raise TraceError(
            f"{source}: hash_id_scope: unknown scope {_describe(scope)} (expected local or global)"
        )
    models = obj.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise TraceError(f"{source}: models: must be a list of strings")
    if "requests" not in obj:
        raise TraceError(f"{source}: requests: missing")
    entries = obj["requests"]
    if not isinstance(entries, list):
        raise TraceError(f"{source}: requests: must be a list, got {_describe(entries)}")

    parent = _RequestParser(source, block_size)
    requests: list[Request] = []
    groups: list[SubAgentGroup] = []
    open_group: SubAgentGroup | None = None
    for i, raw in enumerate(entries):
        if isinstance(raw, dict) and raw.get("type") == "subagent":
            agent = _parse_agent(raw, source, i, block_size)
            if open_group is None:
                open_group = SubAgentGroup(join_index=len(requests), agents=[])
                groups.append(open_group)
            if agent.requests:
                open_group.agents.append(agent)
            continue
        open_group = None
        requests.append(parent.request(raw, str(i), len(requests)))
    groups = [g for g in groups if g.agents]
    if not requests and not groups:
        raise TraceError(f"{source}: requests: empty trace")
    return Trace(
        trace_id=str(raw_id),
        source=source,
        block_size=block_size,
        hash_id_scope=scope,
        requests=requests,
        groups=groups,
        tool_tokens=_trace_int(obj, source, "tool_tokens", 0, 0),
        system_tokens=_trace_int(obj, source, "system_tokens", 0, 0),
        models=list(models),
        dataset=dataset,
    )


def _parse_agent(raw: dict[str, Any], source: str, i: int, block_size: int) -> SubAgent:
    label = str(i)
    inner = raw.get("requests")
    if not isinstance(inner, list):
        raise TraceError(f"{source}: request {label}: requests: a sub-agent needs a list of requests")
    parser = _RequestParser(source, block_size)
    reqs: list[Request] = []
    for j, sub in enumerate(inner):
        if isinstance(sub, dict) and sub.get("type") == "subagent":
            raise TraceError(f"{source}: request {i}.{j}: type: nested sub-agents are not supported")
        reqs.append(parser.request(sub, f"{i}.{j}", j))
    spawn = parser.float_field(raw, label, "t", required=True) or 0.0
    agent_id = raw.get("agent_id", f"agent_{i}")
    if not isinstance(agent_id, (str, int)) or isinstance(agent_id, bool):
        raise TraceError(f"{source}: request {label}: agent_id: must be a string, got {_describe(agent_id)}")
    for fld in ("tool_tokens", "system_tokens"):
        value = raw.get(fld, 0)
        if type(value) is not int or value < 0 or value > MAX_TOKENS:
            raise TraceError(
                f"{source}: request {label}: {fld}: must be an integer from 0 to {MAX_TOKENS}, "
                f"got {_describe(value)}"
            )
    return SubAgent(
        agent_id=str(agent_id),
        requests=reqs,
        subagent_type=str(raw.get("subagent_type") or ""),
        t=spawn,
        tool_tokens=raw.get("tool_tokens", 0),
        system_tokens=raw.get("system_tokens", 0),
    )


MOONCAKE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})


def is_mooncake_row(obj: Any) -> bool:
    return isinstance(obj, dict) and "input_length" in obj and "requests" not in obj


def parse_mooncake_row(obj: Any, source: str, *, trace_id: str, dataset: str, block_size: int) -> Trace:
    """One mooncake_trace row (timestamp ms, input_length, output_length, hash_ids) as a one-request trace.

    Mooncake ids are global (shared by the whole file); the arrival time becomes ``Trace.t0``.
    """
    if not isinstance(obj, dict):
        raise TraceError(f"{source}: request 0: must be an object, got {_describe(obj)}")
    parser = _RequestParser(source, block_size)
    renamed = {
        "in": obj.get("input_length"),
        "out": obj.get("output_length"),
        "t": 0.0,
        "hash_ids": obj.get("hash_ids", []),
    }
    for ours, theirs in (("in", "input_length"), ("out", "output_length")):
        if theirs not in obj:
            raise TraceError(f"{source}: request 0: {theirs}: missing")
        renamed[ours] = obj[theirs]
    try:
        req = parser.request(renamed, "0", 0)
    except TraceError as err:  # report the mooncake field names
        text = str(err).replace(": in:", ": input_length:").replace(": out:", ": output_length:")
        raise TraceError(text) from None
    stamp = parser.float_field(obj, "0", "timestamp", required=True) or 0.0
    return Trace(
        trace_id=trace_id,
        source=source,
        block_size=block_size,
        hash_id_scope="global",
        requests=[req],
        dataset=dataset,
        t0=stamp / 1000.0,
    )
