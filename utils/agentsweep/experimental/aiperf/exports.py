"""AIPerf's exports -> our requests.jsonl + summary.json, so collect treats both clients alike.

profile_export.jsonl holds one record per request (``metadata`` + ``metrics`` with units, or an
``error``). Each becomes a requests.jsonl line with the replayer's keys (ARCHITECTURE §4) plus
``client: "aiperf"``. Theoretical hits are recomputed from the trace hash ids in dispatch order
(infinite cache per trace scope), exactly as the replayer counts them. summary.json is then built by
the replayer's own summary code from those lines, so every figure has one definition; AIPerf's own
aggregate (profile_export_aiperf.json) is kept under ``aiperf`` for reference.

Mapping: AIPerf has no user lanes (``user`` is null); the profiling window starts when the last
warmup request finished and ends at the last profiling dispatch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kv_cache_tester.replay import (
    REQUESTS_FILE,
    Phase,
    RequestError,
    RequestRecord,
    RunMeta,
    Summary,
    build_summary,
    itl_summary,
    write_records,
    write_summary,
)
from kv_cache_tester.stats import LogHistogram
from kv_cache_tester.traces.cache import PrefixTracker

from agentsweep.errors import InputError
from agentsweep.experimental.aiperf.traces import SUBAGENT_MARK, PreparedInput

RECORDS_FILE = "profile_export.jsonl"
AGGREGATE_FILE = "profile_export_aiperf.json"
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}


def _metric(metrics: dict[str, Any], name: str) -> Any:
    item = metrics.get(name)
    if isinstance(item, dict):
        return item.get("value"), item.get("unit")
    return None, None


def _seconds(metrics: dict[str, Any], name: str) -> float | None:
    value, unit = _metric(metrics, name)
    if value is None or isinstance(value, list):
        return None
    return float(value) * _TIME_UNITS.get(unit or "ms", 1e-3)


def _seconds_list(metrics: dict[str, Any], name: str) -> list[float]:
    value, unit = _metric(metrics, name)
    if not isinstance(value, list):
        return []
    factor = _TIME_UNITS.get(unit or "ms", 1e-3)
    return [float(v) * factor for v in value]


def _count(metrics: dict[str, Any], name: str) -> int | None:
    value, _ = _metric(metrics, name)
    return None if value is None or isinstance(value, list) else int(value)


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise InputError(f"{path}: no such file (AIPerf writes it with --export-level records)")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: line {n}: bad JSON ({err.msg})") from None
        meta = rec.get("metadata") if isinstance(rec, dict) else None
        if not isinstance(meta, dict) or "request_start_ns" not in meta:
            raise InputError(f"{path}: line {n}: not an AIPerf record (no metadata.request_start_ns)")
        out.append(rec)
    return out


def _session_of(conversation_id: str) -> tuple[str, str]:
    """(trace id, our session id) from an AIPerf conversation id."""
    trace, _, agent = conversation_id.partition(SUBAGENT_MARK)
    return trace, f"{trace}:{agent}" if agent else trace


def _error(err: Any) -> RequestError:
    if not isinstance(err, dict):
        return {"class": "unknown", "message": str(err)}
    code = err.get("code")
    cls = (
        f"http_{code}" if isinstance(code, int) else str(err.get("type") or "error").lower().replace(" ", "_")
    )
    return {"class": cls, "message": str(err.get("message") or err.get("type") or "")[:500]}


def convert_records(
    records: list[dict[str, Any]], prepared: PreparedInput | None
) -> tuple[list[RequestRecord], float, LogHistogram]:
    """Our per-request lines (dispatch order), the run's t0 (Unix s) and the profile ITL histogram."""
    records = sorted(records, key=lambda r: r["metadata"]["request_start_ns"])
    if not records:
        return [], 0.0, LogHistogram()
    t0_ns = min(r["metadata"].get("credit_issued_ns") or r["metadata"]["request_start_ns"] for r in records)
    tracker = PrefixTracker()
    hist = LogHistogram()
    out: list[RequestRecord] = []
    for rec in records:
        meta, metrics = rec["metadata"], rec.get("metrics") or {}
        conv = str(meta.get("conversation_id") or "")
        turn = int(meta.get("turn_index") or 0)
        info = prepared.lookup(conv, turn) if prepared else None
        trace_id, session_id = (info.trace_id, info.session_id) if info else _session_of(conv)
        phase: Phase = "warmup" if meta.get("benchmark_phase") == "warmup" else "profile"
        start = (meta["request_start_ns"] - t0_ns) / 1e9
        end_ns = meta.get("request_end_ns") or meta["request_start_ns"]
        ok = not rec.get("error") and not meta.get("was_cancelled")
        itls = _seconds_list(metrics, "inter_chunk_latency") if ok else []
        if itls and phase == "profile":
            hist.add_many(itls)
        server_prompt = _count(metrics, "usage_prompt_tokens")
        isl = _count(metrics, "input_sequence_length")
        hit = tracker.observe(info.hash_ids, info.scope) if info else None
        out.append(
            {
                "trace_id": trace_id,
                "session_id": session_id,
                "user": None,
                "turn": turn,
                "phase": phase,
                "request_id": meta.get("x_request_id"),
                "t_dispatch": start,
                "t_done": (end_ns - t0_ns) / 1e9,
                "ttft_s": _seconds(metrics, "time_to_first_token") if ok else None,
                "e2e_s": _seconds(metrics, "request_latency") if ok else None,
                "itl_s": itl_summary(itls),
                "tpot_s": _seconds(metrics, "inter_token_latency") if ok else None,
                "prompt_tokens": server_prompt
                if server_prompt is not None
                else (isl or (info.in_tokens if info else None)),
                "prompt_tokens_source": "server" if server_prompt is not None else "synthesized",
                "cached_tokens": _count(metrics, "usage_prompt_cache_read_tokens"),
                "expected_prompt_tokens": info.in_tokens if info else isl,
                "output_tokens": _count(metrics, "usage_completion_tokens")
                if _count(metrics, "usage_completion_tokens") is not None
                else (_count(metrics, "output_token_count") or 0),
                "expected_output_tokens": info.out_tokens if info else None,
                "theoretical_hit_blocks": hit,
                "total_blocks": len(info.hash_ids) if info else None,
                "status": "ok" if ok else "error",
                "error": None
                if ok
                else _error(rec.get("error") or {"type": "cancelled", "message": "cancelled"}),
                "client": "aiperf",
            }
        )
    return out, t0_ns / 1e9, hist


def write_outputs(
    artifact_dir: Path,
    out_dir: Path,
    prepared: PreparedInput | None,
    *,
    users: int,
    options: dict[str, Any],
    cpu_s: float = 0.0,
    wall_s: float = 0.0,
    reason: str = "duration",
) -> Summary:
    """Write requests.jsonl and summary.json into ``out_dir``; returns the summary."""
    records = read_records(artifact_dir / RECORDS_FILE)
    lines, t0_unix, hist = convert_records(records, prepared)
    out_dir.mkdir(parents=True, exist_ok=True)
    req_path = out_dir / REQUESTS_FILE
    write_records(req_path, lines)
    prof = [r for r in lines if r["phase"] == "profile"]
    stop_rel = max((r["t_dispatch"] for r in prof), default=0.0)
    end_rel = max((r["t_done"] for r in lines), default=0.0)
    meta = RunMeta(
        t0_unix=t0_unix,
        stop_rel=stop_rel,
        end_rel=end_rel,
        reason=reason,
        first_dispatch=[],
        abandoned=0,
        idle_lanes=0,
        cpu_s=cpu_s,
        wall_s=wall_s or max(end_rel, 1e-9),
        itl_hist=hist.to_dict(),
    )
    summary = build_summary(req_path, [meta], users=users, options=options, slo_ttft=None, slo_tpot=None)
    summary["client"] = "aiperf"
    agg_path = artifact_dir / AGGREGATE_FILE
    if agg_path.is_file():
        try:
            agg = json.loads(agg_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise InputError(f"{agg_path}: bad JSON ({err.msg})") from None
        summary["aiperf"] = _aggregate_digest(agg)
    write_summary(out_dir, summary)
    return summary


def _aggregate_digest(agg: dict[str, Any]) -> dict[str, Any]:
    """AIPerf's own headline figures (avg/p50/p99 per metric, its units), for cross-checking."""
    keep = (
        "request_throughput",
        "output_token_throughput",
        "time_to_first_token",
        "inter_token_latency",
        "request_latency",
        "theoretical_prefix_cache_hit",
        "request_count",
        "error_request_count",
        "overall_usage_prompt_cache_read_pct",
    )
    digest: dict[str, Any] = {}
    for name in keep:
        item = agg.get(name)
        if isinstance(item, dict):
            digest[name] = {
                k: v
                for k, v in item.items()
                if k in ("unit", "avg", "p50", "p99") and (not isinstance(v, float) or math.isfinite(v))
            }
    return digest
