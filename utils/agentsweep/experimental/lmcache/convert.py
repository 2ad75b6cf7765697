"""LMCache agentic traces (parquet shards) -> mooncake_trace JSONL (AIPerf) and our trace model (replayer).

A row is one model call: ``session_id``, ``model``, ``input`` (the cumulative OpenAI messages list,
stored as a list of structs or as a JSON string), ``output_length`` (completion tokens) and
``pre_gap`` (seconds from the previous response's end to this call). Rows of a session keep their
file order; sessions keep the order of their first row.

Two outputs:

* mooncake_trace rows: ``session_id``, ``messages`` (cleaned), ``output_length``, ``delay`` (ms);
  null optional fields (``tool_calls``, ``tool_call_id``, ``name``...) are dropped because vLLM rejects
  them, and role ``system`` may become ``developer``;
* kv-cache-tester trace objects (one per session, ``hash_id_scope: global``): ``in`` is the token count
  of the rendered conversation and ``hash_ids`` name each whole ``block_size`` block by a chained
  hash of the rendered prefix up to that block's end, so equal prefixes (a shared system prompt, the
  previous turn) get equal ids across the whole conversion.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentsweep.errors import InputError

REQUIRED_COLUMNS = ("session_id", "input", "output_length")
OPTIONAL_COLUMNS = ("model", "pre_gap")
# Keys a message may carry with a null value in the parquet struct; dropped when null.
NULLABLE_KEYS = ("tool_calls", "tool_call_id", "name", "reasoning_content", "refusal")
ROLES = ("system", "developer", "user", "assistant", "tool", "function")

Tokenize = Callable[[str], Sequence[Any]]


@dataclass(slots=True)
class Row:
    session_id: str
    model: str
    messages: list[dict[str, Any]]  # cleaned
    output_length: int
    pre_gap: float
    where: str  # "<file>: row <n>" for messages


# -- reading ---------------------------------------------------------------------------------------


def parquet_files(source: Path) -> list[Path]:
    """The parquet shards a path names: the file itself, or every ``*.parquet`` below a directory."""
    if not source.exists():
        raise InputError(f"{source}: no such file or directory")
    if source.is_dir():
        files = sorted(p for p in source.rglob("*.parquet") if p.is_file())
        if not files:
            raise InputError(f"{source}: no .parquet files in this directory")
        return files
    if source.suffix != ".parquet":
        raise InputError(f"{source}: not a parquet file (expected .parquet or a directory of them)")
    return [source]


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - depends on the environment
        raise InputError("reading LMCache parquet traces needs pyarrow: pip install 'pyarrow>=15'") from None
    return pq


def iter_rows(
    files: Iterable[Path], *, system_role: str = "system", batch_rows: int = 256, limit: int | None = None
) -> Iterator[Row]:
    """Every row of the shards, checked and cleaned, streamed batch by batch."""
    pq = _pyarrow_parquet()
    seen = 0
    for path in files:
        try:
            pf = pq.ParquetFile(path)
        except Exception as err:  # pyarrow raises several types for a bad file
            raise InputError(f"{path}: not a readable parquet file ({_first_line(err)})") from None
        names = set(pf.schema_arrow.names)
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise InputError(
                f"{path}: missing column(s) {', '.join(missing)} "
                f"(expected {', '.join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)})"
            )
        columns = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in names]
        n = 0
        for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
            for raw in batch.to_pylist():
                yield parse_row(raw, f"{path}: row {n}", system_role=system_role)
                n += 1
                seen += 1
                if limit is not None and seen >= limit:
                    return


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def parse_row(raw: dict[str, Any], where: str, *, system_role: str = "system") -> Row:
    sid = raw.get("session_id")
    if sid is None or (isinstance(sid, str) and not sid.strip()) or isinstance(sid, bool):
        raise InputError(f"{where}: session_id: missing or empty")
    out = raw.get("output_length")
    if isinstance(out, float) and out.is_integer():
        out = int(out)
    if type(out) is not int or out < 0:
        raise InputError(f"{where}: output_length: must be a non-negative integer, got {out!r}")
    gap = raw.get("pre_gap")
    if gap is None or (isinstance(gap, float) and math.isnan(gap)):
        gap = 0.0
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not math.isfinite(gap) or gap < 0:
        raise InputError(f"{where}: pre_gap: must be a number of seconds >= 0, got {gap!r}")
    model = raw.get("model") or ""
    if not isinstance(model, str):
        raise InputError(f"{where}: model: must be a string, got {model!r}")
    messages = raw.get("input")
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as err:
            raise InputError(f"{where}: input: not a JSON messages list ({err.msg})") from None
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{where}: input: must be a non-empty list of messages")
    cleaned = [clean_message(m, f"{where}: input[{i}]", system_role) for i, m in enumerate(messages)]
    return Row(str(sid), model, cleaned, out, float(gap), where)


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def clean_message(msg: Any, where: str, system_role: str = "system") -> dict[str, Any]:
    """A message vLLM accepts: null optional fields and empty ``tool_calls`` dropped, content never null."""
    if not isinstance(msg, dict):
        raise InputError(f"{where}: must be a message object, got {type(msg).__name__}")
    role = msg.get("role")
    if role not in ROLES:
        raise InputError(f"{where}: role: expected one of {', '.join(ROLES)}, got {role!r}")
    content = msg.get("content")
    if content is not None and not isinstance(content, str | list):
        raise InputError(
            f"{where}: content: must be a string or a list of parts, got {type(content).__name__}"
        )
    out: dict[str, Any] = {"role": system_role if role == "system" else role, "content": content or ""}
    if isinstance(content, list):
        out["content"] = _drop_nulls(content)
    for key, value in msg.items():
        if key in ("role", "content") or value is None:
            continue
        if key == "tool_calls" and not value:
            continue
        out[key] = _drop_nulls(value)
    return out


# -- grouping --------------------------------------------------------------------------------------


def group_sessions(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """Rows by session, sessions in order of first appearance, rows in file order."""
    sessions: dict[str, list[Row]] = {}
    for row in rows:
        sessions.setdefault(row.session_id, []).append(row)
    return sessions


# -- mooncake_trace --------------------------------------------------------------------------------


def mooncake_rows(session: Sequence[Row]) -> Iterator[dict[str, Any]]:
    """A session's mooncake_trace rows for AIPerf's multi-turn replay (``delay`` in ms before each turn)."""
    for k, row in enumerate(session):
        out: dict[str, Any] = {"session_id": row.session_id, "messages": row.messages}
        if k > 0 and row.pre_gap > 0:
            out["delay"] = round(row.pre_gap * 1000.0)
        out["output_length"] = row.output_length
        yield out


# -- our trace model -------------------------------------------------------------------------------


def words(text: str) -> list[str]:
    """The simulated engine's tokenizer: one whitespace-separated word is one token."""
    return text.split()


def hf_tokenizer(path: Path) -> Tokenize:
    """A local Hugging Face ``tokenizer.json`` (or a directory holding one) as a Tokenize function."""
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"{path}: no tokenizer.json here")
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - depends on the environment
        raise InputError("--tokenizer needs the tokenizers package: pip install tokenizers") from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:
        raise InputError(f"{file}: not a tokenizers file ({_first_line(err)})") from None
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content or []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif isinstance(part, str):
            parts.append(part)
    return "\n".join(parts)


def render_message(msg: dict[str, Any]) -> str:
    """The text a message contributes to the prompt (role marker, content, tool calls), for counting."""
    pieces = [f"<|{msg['role']}|>", _content_text(msg.get("content"))]
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        pieces.append(f"<|tool_call|> {fn.get('name', '')} {fn.get('arguments', '')}")
    if msg.get("tool_call_id"):
        pieces.append(f"<|tool_result|> {msg['tool_call_id']}")
    return "\n".join(pieces)


GENERATION_PROMPT = "<|assistant|>"


@dataclass
class _SessionState:
    messages: list[dict[str, Any]] = field(default_factory=list)
    msg_ends: list[int] = field(default_factory=list)  # token offset after each message
    tokens: list[Any] = field(default_factory=list)  # tokens of the messages (no generation prompt)
    digests: list[bytes] = field(default_factory=list)  # chained digest per whole block of (tokens + gen)


class BlockHasher:
    """Turns cumulative conversations into token counts and global block ids (ids from 1).

    Work is incremental per session: messages equal to the previous row's are not tokenized again and
    whole blocks inside the shared token prefix keep their digests.
    """

    def __init__(self, block_size: int, tokenize: Tokenize = words) -> None:
        if block_size < 1:
            raise InputError(f"--block-size: must be >= 1, got {block_size}")
        self.block_size = block_size
        self.tokenize = tokenize
        self._gen = list(tokenize(GENERATION_PROMPT))
        self._ids: dict[bytes, int] = {}
        self._states: dict[str, _SessionState] = {}

    @property
    def distinct_blocks(self) -> int:
        return len(self._ids)

    def request(self, session_id: str, messages: list[dict[str, Any]]) -> tuple[int, list[int]]:
        """(prompt tokens, hash ids of its whole blocks) of one call."""
        st = self._states.setdefault(session_id, _SessionState())
        common = 0
        limit = min(len(st.messages), len(messages))
        while common < limit and st.messages[common] == messages[common]:
            common += 1
        keep = st.msg_ends[common - 1] if common else 0
        tokens = st.tokens[:keep]
        ends = st.msg_ends[:common]
        for msg in messages[common:]:
            tokens.extend(self.tokenize(render_message(msg)))
            ends.append(len(tokens))
        full = tokens + self._gen
        bs = self.block_size
        # digests of blocks inside the unchanged token prefix stay valid
        digests = st.digests[: min(len(st.digests), keep // bs)]
        prev = digests[-1] if digests else b""
        for b in range(len(digests), len(full) // bs):
            chunk = "\x1f".join(map(str, full[b * bs : (b + 1) * bs])).encode("utf-8", "surrogatepass")
            prev = hashlib.blake2b(prev + chunk, digest_size=16).digest()
            digests.append(prev)
        st.messages, st.msg_ends, st.tokens, st.digests = list(messages), ends, tokens, digests
        ids = [self._ids.setdefault(d, len(self._ids) + 1) for d in digests]
        return len(full), ids

    def forget(self, session_id: str) -> None:
        self._states.pop(session_id, None)


def trace_object(session: Sequence[Row], hasher: BlockHasher) -> dict[str, Any]:
    """One session as a kv-cache-tester trace object (global hash ids; ``t`` = sum of the gaps so far)."""
    requests = []
    t = 0.0
    system_tokens = 0
    for k, row in enumerate(session):
        in_tokens, ids = hasher.request(row.session_id, row.messages)
        if k == 0:
            system_tokens = sum(
                len(hasher.tokenize(render_message(m)))
                for m in row.messages
                if m["role"] in ("system", "developer")
            )
        gap = row.pre_gap if k > 0 else 0.0
        t += gap
        requests.append(
            {
                "t": round(t, 6),
                "type": "n",
                "model": row.model or None,
                "in": in_tokens,
                "out": row.output_length,
                "hash_ids": ids,
                "think_time": gap,
            }
        )
    hasher.forget(session[0].session_id)
    models = sorted({r.model for r in session if r.model})
    return {
        "id": session[0].session_id,
        "models": models,
        "block_size": hasher.block_size,
        "hash_id_scope": "global",
        "tool_tokens": 0,
        "system_tokens": system_tokens,
        "requests": requests,
    }


# -- writing ---------------------------------------------------------------------------------------


@dataclass
class ConvertReport:
    sessions: int = 0
    rows: int = 0
    prompt_tokens: int = 0
    hit_blocks: int = 0  # blocks whose id was seen before (infinite cache, conversion order)
    total_blocks: int = 0
    distinct_blocks: int = 0

    def line(self) -> str:
        rate = self.hit_blocks / self.total_blocks if self.total_blocks else 0.0
        return (
            f"{self.sessions} sessions, {self.rows} requests, {self.prompt_tokens} prompt tokens, "
            f"{self.distinct_blocks} distinct blocks, theoretical prefix hit rate {rate:.1%}"
        )


def convert(
    source: Path,
    *,
    mooncake_out: Path | None = None,
    traces_out: Path | None = None,
    block_size: int = 64,
    tokenize: Tokenize = words,
    system_role: str = "system",
    limit: int | None = None,
) -> ConvertReport:
    """Convert the shards under ``source`` into either or both outputs (JSONL files)."""
    if mooncake_out is None and traces_out is None:
        raise InputError("nothing to write: give --mooncake-out and/or --traces-out")
    if system_role not in ("system", "developer"):
        raise InputError(f"--system-role: expected system or developer, got {system_role!r}")
    hasher = BlockHasher(block_size, tokenize)  # checks block_size before reading anything
    sessions = group_sessions(iter_rows(parquet_files(source), system_role=system_role, limit=limit))
    if not sessions:
        raise InputError(f"{source}: no rows")
    report = ConvertReport(sessions=len(sessions))
    seen: set[int] = set()
    outs = [p for p in (mooncake_out, traces_out) if p is not None]
    for p in outs:
        p.parent.mkdir(parents=True, exist_ok=True)
    mc = open(mooncake_out, "w", encoding="utf-8") if mooncake_out else None  # noqa: SIM115
    tr = open(traces_out, "w", encoding="utf-8") if traces_out else None  # noqa: SIM115
    try:
        for rows in sessions.values():
            report.rows += len(rows)
            if mc is not None:
                for obj in mooncake_rows(rows):
                    mc.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
            if tr is not None:
                obj = trace_object(rows, hasher)
                for req in obj["requests"]:
                    report.prompt_tokens += req["in"]
                    report.total_blocks += len(req["hash_ids"])
                    report.hit_blocks += sum(1 for i in req["hash_ids"] if i in seen)
                    seen.update(req["hash_ids"])
                tr.write(json.dumps(obj, separators=(",", ":")) + "\n")
    finally:
        for fh in (mc, tr):
            if fh is not None:
                fh.close()
    report.distinct_blocks = hasher.distinct_blocks
    return report
