"""The export's files, laid out as an InferenceX run's artifacts (docs/export.md, "Files").

For each point ``P`` (its exp_name):

- ``bmk_agentic_P/P.json``: the row, one JSON object (their per-job result artifact; their collector
  reads every ``*.json`` under the downloaded ``bmk_*`` artifacts and keeps each file as one row);
- ``agentic_P/``: the raw sibling their detail pages read. ``aiperf_artifacts/profile_export.jsonl``
  holds one AIPerf-shaped record per request of requests.jsonl (latencies in milliseconds, in the
  engine's clock for a simulated cell, as the row; timestamps on the wall clock),
  ``aiperf_artifacts/server_metrics_export.json`` the engine's metrics over the measurement window in
  AIPerf's export form (per metric, series of stats: ``total`` for a counter's growth, ``avg``/``max``/
  ``min`` for a gauge), under the engine's metric names (vLLM's for vllm and the simulated engine,
  SGLang's for sglang), and ``power.csv`` the power samples the row's power audit names.
- ``eval_P/``: a cell whose engine the accuracy gate scored, as InferenceX's eval jobs leave it
  (``utils/evals/validate_scores.py`` reads these two): ``results_<task>.json`` in lm-eval's results
  shape (``results.<task>."exact_match,strict-match"`` and its stderr, ``n-samples``) and
  ``meta_env.json`` naming the model key its threshold is resolved by.
- ``results_bmk/agg_bmk.json``: every row in one array, as their collector writes it.

Every file is read from the result directory through its owner (requests.jsonl through
``RecordReader``, server_metrics.csv through ``read_series``, power.csv through ``PowerCsvReader``);
summary.json's window comes with the point, as collect read it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kv_cache_tester.metrics import record_full_response_itl_s
from kv_cache_tester.replay import RecordReader, ResultError, load_summary
from kv_cache_tester.replay.results import RequestRecord

from agentsweep.collect.window import COUNTERS, read_series
from agentsweep.contract.resultdir import POWER_CSV, REQUESTS_JSONL, SERVER_METRICS_CSV
from agentsweep.energy.powercsv import GpuReading, PowerCsvReader, PowerCsvWriter
from agentsweep.errors import ResultFileError
from agentsweep.export.build import POWER_SOURCE, Point
from agentsweep.export.inferencex import model_prefix

ROW_DIR = "bmk_agentic_{name}"
RAW_DIR = "agentic_{name}"
AGGREGATE = Path("results_bmk") / "agg_bmk.json"
PROFILE = Path("aiperf_artifacts") / "profile_export.jsonl"
SERVER_EXPORT = Path("aiperf_artifacts") / "server_metrics_export.json"

# The engine-neutral columns of server_metrics.csv under the engine's own metric names.
VLLM_NAMES: dict[str, str] = {
    "prompt_tokens_total": "vllm:prompt_tokens",
    "generation_tokens_total": "vllm:generation_tokens",
    "prefix_cache_queries_total": "vllm:prefix_cache_queries",
    "prefix_cache_hits_total": "vllm:prefix_cache_hits",
    "cpu_cache_hits_total": "vllm:external_prefix_cache_hits",
    "preemptions_total": "vllm:num_preemptions",
    "offload_bytes_gpu_to_cpu_total": "vllm:kv_offload_bytes_gpu_to_cpu",
    "offload_bytes_cpu_to_gpu_total": "vllm:kv_offload_bytes_cpu_to_gpu",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "cpu_kv_cache_usage": "vllm:cpu_kv_cache_usage_perc",
    "requests_running": "vllm:num_requests_running",
    "requests_waiting": "vllm:num_requests_waiting",
}
SGLANG_NAMES: dict[str, str] = {
    "prompt_tokens_total": "sglang:prompt_tokens",
    "generation_tokens_total": "sglang:generation_tokens",
    "prefix_cache_hits_total": "sglang:cached_tokens",
    "kv_cache_usage": "sglang:token_usage",
    "requests_running": "sglang:num_running_reqs",
    "requests_waiting": "sglang:num_queue_reqs",
}


def row_file(root: Path, name: str) -> Path:
    return root / ROW_DIR.format(name=name) / f"{name}.json"


def raw_dir(root: Path, name: str) -> Path:
    return root / RAW_DIR.format(name=name)


def _ms(seconds: float | None) -> dict[str, Any] | None:
    return None if seconds is None else {"value": seconds * 1e3, "unit": "ms"}


def _tokens(count: int | None) -> dict[str, Any] | None:
    return None if count is None else {"value": count, "unit": "tokens"}


def _start_unix(point: Point, result_dir: Path) -> float | None:
    """The run's start on the wall clock: the window's start less its offset from the run start
    (None for a summary written before the window said its offset, or without a summary). The window
    is the point's (collect read summary.json); a FAILED cell's CellResult holds no summary, so its
    summary.json, when the run left one, is read here."""
    window = point.window
    if window is None:
        try:
            window = load_summary(result_dir)["window"]
        except ResultError:
            return None
    offset = window.get("start_s")
    return None if offset is None else window["start_unix"] - offset


def profile_record(record: RequestRecord, t0_unix: float) -> dict[str, Any]:
    """One request as an AIPerf profile record. A record with the engine's own timeline (the
    simulated engine) gives its latencies in that clock, as the row's figures are."""
    engine = record.get("engine")
    ttft: float | None
    e2e: float | None
    out: int | None
    if engine is not None:
        ttft, e2e, out = engine["ttft_s"], engine["e2e_s"], engine["output_tokens"]
        gap = engine["itl_s"].get("mean")
    else:
        ttft, e2e, out = record.get("ttft_s"), record.get("e2e_s"), record.get("output_tokens")
        gap = record["itl_s"].get("mean") if record.get("itl_s") else None
    full_itl = record_full_response_itl_s({"ttft_s": ttft, "e2e_s": e2e, "output_tokens": out})
    start_ns = round((t0_unix + record["t_dispatch"]) * 1e9)
    end_ns = round((t0_unix + record["t_done"]) * 1e9) if "t_done" in record else None
    session = record["session_id"]
    error = record.get("error")
    metrics = {
        "time_to_first_token": _ms(ttft),
        "request_latency": _ms(e2e),
        "inter_token_latency": _ms(gap),
        "full_response_inter_token_latency": _ms(full_itl),
        "input_sequence_length": _tokens(record.get("prompt_tokens")),
        "output_sequence_length": _tokens(out),
    }
    return {
        "metadata": {
            "conversation_id": session,
            "x_correlation_id": f"{record.get('user')}:{record['trace_id']}:{record.get('play', 0)}",
            "turn_index": record["turn"],
            "worker_id": f"lane-{record.get('user')}",
            "agent_depth": 1 if ":" in session else 0,
            "benchmark_phase": "profiling" if record["phase"] == "profile" else "warmup",
            "request_start_ns": start_ns,
            "request_end_ns": end_ns,
            "was_cancelled": False,
        },
        "metrics": {k: v for k, v in metrics.items() if v is not None},
        "error": None if error is None else {"type": error["class"], "message": error.get("message")},
    }


def profile_lines(result_dir: Path, point: Point) -> Iterator[str]:
    """requests.jsonl as AIPerf profile records, one JSON line each (nothing without a run start)."""
    t0 = _start_unix(point, result_dir)
    path = result_dir / REQUESTS_JSONL
    if t0 is None or not path.is_file():
        return
    for record in RecordReader(path, required=("trace_id", "t_dispatch", "turn", "phase", "session_id")):
        yield json.dumps(profile_record(record, t0), allow_nan=False)


def server_export(result_dir: Path, point: Point) -> dict[str, Any] | None:
    """The engine's metrics over the window in AIPerf's export form; None without scrapes."""
    start, end = point.row.number("window_start_unix"), point.row.number("window_end_unix")
    path = result_dir / SERVER_METRICS_CSV
    if start is None or end is None or not path.is_file():
        return None
    try:
        series, _, _ = read_series(path)
    except ValueError:  # NotNumbers: collect has said so; no export of figures it could not read
        return None
    names = SGLANG_NAMES if point.cell.engine == "sglang" else VLLM_NAMES
    metrics: dict[str, Any] = {}
    for column, name in names.items():
        s = series[column]
        if column in COUNTERS:
            v0, v1 = s.at(start), s.at(end)
            if v0 is None or v1 is None or v1 < v0:
                continue
            stats: dict[str, float] = {"total": v1 - v0}
        else:
            inside = s.inside(start, end)
            if not inside:
                continue
            stats = {"avg": sum(inside) / len(inside), "max": max(inside), "min": min(inside)}
        metrics[name] = {"series": [{"labels": {}, "stats": stats}]}
    if "vllm:prefix_cache_queries" in metrics and "vllm:external_prefix_cache_hits" in metrics:
        metrics["vllm:external_prefix_cache_queries"] = metrics["vllm:prefix_cache_queries"]
    return {"window": {"start_unix": start, "end_unix": end}, "metrics": metrics}


def copy_power(result_dir: Path, target: Path) -> bool:
    """power.csv's readable rows into ``target`` (False when the cell has none)."""
    source = result_dir / POWER_CSV
    if not source.is_file():
        return False
    try:
        rows = list(PowerCsvReader(source))
    except ResultFileError:
        return False
    with PowerCsvWriter(target) as writer:
        for row in rows:
            if row.fault:
                writer.fault(row.time_s, row.node, row.fault, row.gpu)
            else:
                reading = GpuReading(
                    row.gpu, row.power_w, row.energy_j, row.temp_c, row.util_pct, row.mem_used_mib
                )
                writer.sample(row.time_s, row.node, reading)
    return True


EVAL_DIR = "eval_{name}"


def eval_files(point: Point) -> dict[str, dict[str, Any]] | None:
    """The accuracy gate's score as InferenceX's eval artifacts (file name -> object); None when the
    cell's engine was not scored."""
    row = point.row
    task, score, questions = (
        row.text("accuracy_task"),
        row.number("accuracy_score"),
        row.number("accuracy_questions"),
    )
    if not task or score is None or not questions:
        return None
    n = round(questions)
    stderr = math.sqrt(score * (1 - score) / (n - 1)) if n > 1 else None
    spec = point.cell.accuracy
    metric = f"{spec.info.metric},{spec.info.filter}"
    results = {
        "results": {task: {"alias": task, metric: score, metric.replace(",", "_stderr,", 1): stderr}},
        "n-samples": {task: {"original": n, "effective": n}},
        "config": {"model": "local-chat-completions", "model_args": f"model={point.cell.model}"},
        "n-shot": {task: spec.effective_fewshot},
    }
    meta = {
        "infmax_model_prefix": model_prefix(point.cell) or "unknown",
        "model": point.cell.model,
        "simulated": point.cell.simulated,  # a simulated engine's score (accuracy: on) says so
        "threshold": row.number("accuracy_threshold"),
        "outcome": row.text("accuracy_outcome") or None,
    }
    return {f"results_{task}.json": results, "meta_env.json": meta}


def write_layout(root: Path, rows: list[dict[str, Any]], points: list[Point]) -> None:
    """Every file of the export under ``root`` (an empty directory)."""
    for row, point in zip(rows, points, strict=True):
        name = point.exp_name
        target = row_file(root, name)
        target.parent.mkdir(parents=True)
        target.write_text(json.dumps(row, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        result_dir = Path(point.row.result_dir or "")
        raw = raw_dir(root, name)
        (raw / PROFILE.parent).mkdir(parents=True)
        with (raw / PROFILE).open("w", encoding="utf-8") as fh:
            for line in profile_lines(result_dir, point):
                fh.write(line + "\n")
        server = server_export(result_dir, point)
        if server is not None:
            (raw / SERVER_EXPORT).write_text(json.dumps(server, indent=1, allow_nan=False) + "\n")
        if "power_audit" in row:
            copy_power(result_dir, raw / POWER_SOURCE)
        evals = eval_files(point)
        if evals is not None:
            folder = root / EVAL_DIR.format(name=name)
            folder.mkdir()
            for file_name, doc in evals.items():
                (folder / file_name).write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    (root / AGGREGATE).parent.mkdir(parents=True)
    (root / AGGREGATE).write_text(json.dumps(rows, indent=1, allow_nan=False) + "\n", encoding="utf-8")
