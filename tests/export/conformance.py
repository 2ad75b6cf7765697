"""The conformance check of an export: every row it wrote, mapped by InferenceX's ingest as restated in
inferencex_ingest.py, against the figures read from the cells' own result files (cell.json,
receipt.json, summary.json, server_metrics.csv, status.txt, and the power summary). Nothing here calls
the exporter, collect, or any code that made the rows."""

from __future__ import annotations

import csv
import json
from bisect import bisect_left
from pathlib import Path
from typing import Any

import pytest

from .inferencex_ingest import Mapped, Skipped, map_row, read_artifacts

STATS = (("median", "p50"), ("p75", "p75"), ("p90", "p90"), ("p99", "p99"))
LATENCIES = (("ttft", "ttft_s"), ("e2el", "e2e_s"), ("itl", "full_response_itl_s"))


def _gpus(cell: dict[str, Any]) -> int:
    if cell.get("gpus"):
        return int(cell["gpus"])
    roles = [cell.get("prefill"), cell.get("decode")]
    return sum(int(r.get("replicas", 1)) * int(r["tp"]) for r in roles if r)


def _at(times: list[float], values: list[float], when: float) -> float:
    i = bisect_left(times, when)
    if i < len(times) and times[i] == when:
        return values[i]
    if i == 0:
        return values[0]
    if i == len(times):
        return values[-1]
    return values[i - 1] + (values[i] - values[i - 1]) * (when - times[i - 1]) / (times[i] - times[i - 1])


def server_figures(path: Path, start: float, end: float) -> dict[str, float | None]:
    """Hit rates (counters' growth over the window, read at its edges) and the peak GPU KV usage."""
    with (path / "server_metrics.csv").open(newline="") as fh:
        rows = sorted(csv.DictReader(fh), key=lambda r: float(r["time_s"]))

    def series(name: str) -> tuple[list[float], list[float]]:
        pts = [(float(r["time_s"]), float(r[name])) for r in rows if r.get(name)]
        return [t for t, _ in pts], [v for _, v in pts]

    def grown(name: str) -> float | None:
        t, v = series(name)
        return _at(t, v, end) - _at(t, v, start) if t else None

    queries = grown("prefix_cache_queries_total")
    hits, cpu = grown("prefix_cache_hits_total"), grown("cpu_cache_hits_total")
    t, usage = series("kv_cache_usage")
    inside = [u for when, u in zip(t, usage, strict=True) if start <= when <= end]
    return {
        "server_gpu_cache_hit_rate": hits / queries if queries and hits is not None else None,
        "server_cpu_cache_hit_rate": cpu / queries if queries and cpu is not None else None,
        "gpu_kv_cache_usage_pct": max(inside) if inside else None,
    }


def expected(cell_dir: Path) -> dict[str, Any]:
    """What a SUCCESS cell's row must map to, from its files."""
    doc = json.loads((cell_dir / "cell.json").read_text())
    cell = doc["cell"]
    summary = json.loads((cell_dir / "summary.json").read_text())
    clock = summary.get("engine_clock") or summary  # a simulated cell reports in its engine's clock
    latency, tput = clock["latency"], clock["throughput"]
    gpus = _gpus(cell)
    metrics: dict[str, float | None] = {}
    for flat, key in LATENCIES:
        for prefix, stat in STATS:
            metrics[f"{prefix}_{flat}"] = latency[key].get(stat)
    for prefix, stat in STATS:
        itl = latency["full_response_itl_s"].get(stat)
        metrics[f"{prefix}_intvty"] = 1 / itl if itl else None
    for prefix, stat in STATS:
        per_token = latency.get("e2e_per_output_token_s", {}).get(stat)
        metrics[f"{prefix}_e2e_norm_intvty"] = 1 / per_token if per_token else None
    metrics.update(
        tput_per_gpu=tput["total_tok_per_s"] / gpus,
        output_tput_per_gpu=tput["output_tok_per_s"] / gpus,
        input_tput_per_gpu=tput["input_tok_per_s"] / gpus,
        theoretical_cache_hit_rate=summary["cache"]["theoretical_hit_rate"],
    )
    window = summary["window"]
    metrics.update(server_figures(cell_dir, window["start_unix"], window["end_unix"]))
    return {
        "cell": cell,
        "gpus": gpus,
        "fingerprint": json.loads((cell_dir / "receipt.json").read_text())["recipe_fingerprint"],
        "metrics": metrics,
    }


def check_topology(mapped: Mapped, cell: dict[str, Any], gpus: int) -> None:
    topo = mapped.topology
    prefill, decode = cell.get("prefill"), cell.get("decode")
    if prefill and decode:
        assert topo.disagg is True
        assert (topo.prefill_tp, topo.prefill_workers) == (prefill["tp"], prefill.get("replicas", 1))
        assert (topo.decode_tp, topo.decode_workers) == (decode["tp"], decode.get("replicas", 1))
        assert topo.num_prefill_gpu + topo.num_decode_gpu == gpus
    else:
        assert topo.disagg is False
        assert topo.prefill_tp == topo.decode_tp == cell["tp"]
        assert topo.prefill_ep == topo.decode_ep == cell.get("ep", 1)
        assert topo.num_prefill_gpu == topo.num_decode_gpu == gpus


def check_export(out: Path, cells: dict[str, Path]) -> dict[str, Mapped]:
    """Every row of the export at ``out`` against its cell (``cells``: exp_name -> result directory).

    SUCCESS rows map, each to a point of its own, with every checked figure equal to its cell's; a row
    of an INVALID or FAILED cell is left out by their ingest as a failed run. Returns the mapped rows.
    """
    files = [f for f in read_artifacts(out) if f.path.startswith("bmk_")]
    assert all(len(f.rows) == 1 and f.non_object_rows == 0 for f in files)
    rows = [f.rows[0] for f in files]
    assert sorted(r["exp_name"] for r in rows) == sorted(cells)
    mapped: dict[str, Mapped] = {}
    for row in rows:
        name = row["exp_name"]
        status = (cells[name] / "status.txt").read_text().split("\n", 1)[0]
        if status != "SUCCESS":
            with pytest.raises(Skipped, match="failedRun"):
                map_row(row)
            continue
        point = map_row(row)  # raises Skipped for a row their ingest would not place
        want = expected(cells[name])
        cell = want["cell"]
        assert point.conc == cell["users"], name
        assert point.offload_mode == ("on" if cell["offload"] == "on" else "off"), name
        assert point.recipe_fingerprint == want["fingerprint"], name
        assert point.framework == cell["engine"] and point.hardware in ("h200", "b200", "mi355x"), name
        check_topology(point, cell, want["gpus"])
        nested = isinstance(row.get("request_metrics"), dict)
        for key, value in want["metrics"].items():
            if nested and key.endswith("_e2e_norm_intvty"):
                # Their flattener reads no such nested block: the row carries it, their ingest does not.
                stat = dict(STATS)[key.removesuffix("_e2e_norm_intvty")]
                got = row["request_metrics"]["latency"]["e2e_norm_intvty"][stat]
                assert key not in point.metrics, (name, key)
                assert got == (None if value is None else pytest.approx(value, rel=1e-9)), (name, key)
            elif value is None:
                assert key not in point.metrics, (name, key)
            else:
                assert point.metrics.get(key) == pytest.approx(value, rel=1e-9, abs=1e-12), (name, key)
        mapped[name] = point
    keys = [p.key() for p in mapped.values()]
    assert len(set(keys)) == len(keys), "two rows are one point to InferenceX"
    return mapped
