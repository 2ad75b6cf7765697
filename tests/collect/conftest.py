"""A factory of synthetic cell result directories that follow the contracts (ARCHITECTURE.md §3-6).

The numbers follow a simple, plausible model (throughput saturates with users, latency grows with
load per GPU, offload raises hits) so the plots and frontiers have shape; tests assert on values
derived from the same inputs written here, never on collect's own output.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agentsweep.metrics.dialects import COLUMNS

WINDOW_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
HIT = {"on": (0.70, 0.15), "off": (0.62, 0.0), "noprefix": (0.0, 0.0)}  # (gpu, cpu) hit rate in window
SPEED = {"on": 1.25, "off": 1.0, "noprefix": 0.55}
TTFT = {"on": 0.7, "off": 1.0, "noprefix": 2.6}


@dataclass(frozen=True)
class Spec:
    config_key: str = "demo"
    engine: str = "sim"
    speed: float = 1.0
    tp: int = 1
    users: int = 4
    offload: str = "on"
    duration: float = 60.0

    @property
    def exp_name(self) -> str:
        return f"{self.config_key}-tp{self.tp}-ep1-u{self.users}-{self.offload}"

    def cell_fields(self) -> dict[str, Any]:
        return {
            "config_key": self.config_key,
            "exp_name": self.exp_name,
            "runner": "local",
            "hardware": "h200",  # the local runner's
            "engine": self.engine,
            "model": "Qwen/Qwen3-32B",
            "precision": "bf16",
            "image": "",
            "tp": self.tp,
            "ep": 1,
            "gpus": self.tp,
            "users": self.users,
            "offload": self.offload,
            "cpu_dram_gb": 64.0 if self.offload == "on" else 0.0,
            "offload_connector": "native",
            "duration": int(self.duration),
            "traces": "kv-cache-tester/sample_traces",
            "max_context": 0,
            "max_delay": 30.0,
            "advance_min": 0.0,
            "advance_max": 0.7,
            "timing_strategy": "think-only",
            "ignore_eos": True,
            "seed": 7,
            "warmup_requests": 1,
            "api": "chat",
            "speed": self.speed,
            "engine_args": "",
            "engine_env": "{}",
            "client": "replay",
        }

    # --- the model behind the numbers -------------------------------------------------------
    def output_tok_per_s(self) -> float:
        per_gpu = 420.0 * self.users / (self.users + 12.0) * SPEED[self.offload] * self.tp**-0.12
        return per_gpu * self.tp

    def input_tok_per_s(self) -> float:
        return self.output_tok_per_s() * 38.0

    def ttft_p50(self) -> float:
        return (0.12 + 0.035 * self.users / self.tp) * TTFT[self.offload]

    def tpot_p50(self) -> float:
        return 0.012 + 0.0011 * self.users / self.tp


def _pcts(p50: float, spread: float) -> dict[str, float]:
    return {
        "mean": p50 * 1.1,
        "p50": p50,
        "p90": p50 * spread,
        "p95": p50 * spread**1.2,
        "p99": p50 * spread**1.6,
        "p99.9": p50 * spread**2,
    }


def summary_json(spec: Spec) -> dict[str, Any]:
    out_tps, in_tps = spec.output_tok_per_s(), spec.input_tok_per_s()
    ttft, tpot = spec.ttft_p50(), spec.tpot_p50()
    gpu, cpu = HIT[spec.offload]
    # The counts of the records requests_lines writes (the summary agrees with its records).
    profile = range(spec.users, RECORDS)
    failed = sum(1 for i in profile if not _record_ok(i))
    return {
        "schema_version": 1,
        "counts": {
            "sent": len(profile),
            "ok": len(profile) - failed,
            "failed": failed,
            "failed_by_class": {"ReadTimeout": failed},
            "warmup": spec.users,
        },
        "window": {
            "start_unix": WINDOW_START,
            "end_unix": WINDOW_START + spec.duration,
            "duration_s": spec.duration,
        },
        "throughput": {
            "requests_per_s": 2.0,
            "input_tok_per_s": in_tps,
            "output_tok_per_s": out_tps,
            "total_tok_per_s": in_tps + out_tps,
        },
        "latency": {
            "ttft_s": _pcts(ttft, 2.0),
            "tpot_s": _pcts(tpot, 1.3),
            "itl_s": _pcts(tpot, 1.5),
            "e2e_s": _pcts(ttft + 250 * tpot, 1.8),
            "interactivity_tok_per_s": _pcts(1 / tpot, 0.8),
        },
        "slo": {"ttft_s": 5.0, "tpot_s": 0.05, "goodput_requests_per_s": 1.8, "attainment": 0.9},
        "cache": {
            "theoretical_hit_rate": 0.92,
            "client_hit_rate": gpu + cpu,
            "prompt_tokens": 1000,
            "cached_tokens": int(1000 * (gpu + cpu)),
        },
        "self_audit": {
            "dispatch_lag_s": {"p50": 0.001, "p99": 0.004, "max": 0.01},
            "first_dispatch_spread_s": 0.002,
            "client_cpu_s": 3.0,
            "client_cpu_share": 0.05,
        },
        "users": spec.users,
        "options": {"duration": spec.duration, "users": spec.users},
        "validity": {"valid": True, "reasons": [], "checks": {}},
    }


def server_rows(spec: Spec, interval: float = 1.0) -> list[list[str]]:
    """Scrapes from 10 s before the window to 5 s after; warmup (before) has no cache hits."""
    queries_rate = spec.input_tok_per_s()
    gpu, cpu = HIT[spec.offload]
    rows = []
    t = WINDOW_START - 10.0
    while t <= WINDOW_START + spec.duration + 5.0:
        inside = min(max(t - WINDOW_START, 0.0), spec.duration)
        before = min(t - (WINDOW_START - 10.0), 10.0)
        queries = queries_rate * (before + inside)
        values = {
            "kv_cache_usage": 0.3 + 0.5 * abs(math.sin(t / 7.0)),
            "cpu_kv_cache_usage": 0.2 if spec.offload == "on" else None,
            "requests_running": float(spec.users),
            "requests_waiting": 1.0,
            "prompt_tokens_total": queries,
            "generation_tokens_total": spec.output_tok_per_s() * (before + inside),
            "prefix_cache_queries_total": queries,
            "prefix_cache_hits_total": gpu * queries_rate * inside,
            "cpu_cache_hits_total": cpu * queries_rate * inside if spec.offload == "on" else None,
            "preemptions_total": 5.0 + inside / 10.0,
            "offload_bytes_gpu_to_cpu_total": 1e6 * inside if spec.offload == "on" else None,
            "offload_bytes_cpu_to_gpu_total": 5e5 * inside if spec.offload == "on" else None,
            "requests_finished_total": float(int(spec.users * (before + inside))),
            "evicted_tokens_total": None,  # vLLM exports no eviction counter
            # Lookups in the CPU tier: the tokens the GPU did not hold.
            "cpu_cache_queries_total": (1 - gpu) * queries_rate * inside if spec.offload == "on" else None,
        }
        rows.append([f"{t:.3f}"] + ["" if values[c] is None else repr(values[c]) for c in COLUMNS[1:]])
        t += interval
    return rows


RECORDS = 40  # request records of a synthetic cell


def _record_ok(i: int) -> bool:
    return i % 17 != 5


def requests_lines(spec: Spec, n: int = RECORDS) -> list[str]:
    lines = []
    for i in range(n):
        warm = i < spec.users
        ok = _record_ok(i)
        rec = {
            "trace_id": f"t{i % 5}",
            "session_id": f"t{i % 5}",
            "user": i % spec.users,
            "turn": i // spec.users,
            "phase": "warmup" if warm else "profile",
            "t_dispatch": float(i),
            "ttft_s": spec.ttft_p50() * (0.5 + (i % 10) / 10) if ok else None,
            "e2e_s": 3.0 if ok else None,
            "itl_s": {"p50": spec.tpot_p50()},
            "tpot_s": spec.tpot_p50() if ok else None,
            "prompt_tokens": 1000,
            "cached_tokens": 600 if ok else None,
            "expected_prompt_tokens": 1000,
            "output_tokens": 200 if ok else 0,
            "expected_output_tokens": 200,
            "theoretical_hit_blocks": 9,
            "total_blocks": 10,
            "status": "ok" if ok else "error",
            "error": None if ok else "ReadTimeout: timed out",
        }
        lines.append(json.dumps(rec))
    return lines


def write_cell(
    root: Path,
    spec: Spec,
    *,
    status: str = "SUCCESS",
    reason: str | None = None,
    layout: str = "artifact",
    server_metrics: bool = True,
) -> Path:
    """Write one result directory; layout 'artifact' (agentic_<exp>) or 'local' (<key>/<exp>)."""
    path = (
        root / f"agentic_{spec.exp_name}" if layout == "artifact" else root / spec.config_key / spec.exp_name
    )
    path.mkdir(parents=True, exist_ok=True)
    cell_json = {
        "schema_version": 1,
        "cell": spec.cell_fields(),
        "engine_command": [
            "agentsweep",
            "engine-sim",
            "Qwen/Qwen3-32B",
            "--tensor-parallel-size",
            str(spec.tp),
        ],
        "engine_env": {"HF_TOKEN": "***"},
        "replay_command": ["kv-cache-tester", "replay", "--users", str(spec.users)],
        "versions": {"agentsweep": "0.1.0", "kv_cache_tester": "0.1.0", "engine": f"{spec.engine}-1.0"},
        "start_utc": "2026-01-01T00:00:00Z",
        "end_utc": "2026-01-01T00:02:00Z",
        "status": status,
        "reason": reason,
    }
    (path / "cell.json").write_text(json.dumps(cell_json, indent=1))
    (path / "status.txt").write_text(status + ("\n" + reason if reason else "") + "\n")
    if status == "SUCCESS":
        (path / "summary.json").write_text(json.dumps(summary_json(spec)))
        (path / "requests.jsonl").write_text("\n".join(requests_lines(spec)) + "\n")
        if server_metrics:
            with (path / "server_metrics.csv").open("w", newline="") as fh:
                writer = csv.writer(fh)
                writer.writerow(COLUMNS)
                writer.writerows(server_rows(spec))
    return path


GRID = [
    Spec(tp=tp, users=u, offload=o, engine=e)
    for e in ("sim",)
    for tp in (1, 2)
    for u in (2, 8, 32)
    for o in ("on", "off", "noprefix")
]


@pytest.fixture
def cell_factory() -> Callable[..., Path]:
    return write_cell


@pytest.fixture
def spec_cls() -> type[Spec]:
    return Spec


@pytest.fixture(scope="session")
def _collected_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two sweeps of the same 2 cells (users 2 and 8, offload on), each collected once per worker:
    the artifacts and the originals of their collected folders, which no test changes."""
    from agentsweep.cli import main

    root = tmp_path_factory.mktemp("collected-pair")
    outs = []
    for name in ("a", "b"):
        for users in (2, 8):
            write_cell(root / f"art-{name}", Spec(users=users, offload="on"))
        out = root / name
        assert main(["collect", str(root / f"art-{name}"), str(out), "--no-plots"]) == 0
        outs.append(out)
    return outs[0], outs[1]


@pytest.fixture
def collected_pair(_collected_pair: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """Copies of two collected sweeps of the same 2 cells (``_collected_pair``), the test's own to change."""
    a, b = (shutil.copytree(src, tmp_path / src.name) for src in _collected_pair)
    return a, b
