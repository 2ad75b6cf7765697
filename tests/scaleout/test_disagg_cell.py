"""A disaggregated prefill/decode cell end to end: simulated prefill and decode engines, the real router
in its PD mode, the real scrapers and replayer, the validity checks."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest
from agentsweep.contract.cell import CELL_ENV_VAR
from agentsweep.contract.resultdir import read_cell_record, read_router, result_file

from .conftest import MODEL


def _cell(repo_root: Path, program: str) -> dict[str, object]:
    return {
        "config_key": "pd", "exp_name": "pd-tp1-ep1-u4-off-p2x1-d1x1-round_robin", "runner": "local",
        "engine": "sim", "hardware": "h200", "model": MODEL, "precision": "fp8", "tp": 1, "users": 4, "offload": "off",
        "duration": 8, "traces": str(repo_root / "kv-cache-tester" / "sample_traces"), "max_context": 65536,
        "max_delay": 1, "warmup_requests": 0, "speed": 50, "engine_args": "--num-gpu-blocks-override 8192",
        "prefill": {"replicas": 2, "tp": 1}, "decode": {"replicas": 1, "tp": 1}, "router": "round_robin",
        "router_program": program,
        "max_throughput_drift": 5.0,  # an 8 s window is too short for a steady state
    }  # fmt: skip


def _last(path: Path) -> dict[str, str]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))[-1]


@pytest.mark.slow
@pytest.mark.parametrize("program", ["vllm-router", "smg"])
def test_prefill_decode_cell_succeeds_through_the_real_router(repo_root: Path, tmp_path: Path, program: str):
    rd = tmp_path / "cell"
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    env.update({CELL_ENV_VAR: json.dumps(_cell(repo_root, program)), "RESULT_DIR": str(rd)})
    proc = subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "60"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr + (rd / "status.txt").read_text()
    assert (rd / "status.txt").read_text() == "SUCCESS\n"
    summary = json.loads((rd / "summary.json").read_text())
    checks = summary["validity"]["checks"]
    # The client's counts agree with the engines': requests and prompts with the decode instance that
    # answered, cached tokens with the side whose figure the router passes on.
    for name in ("request_count_gap", "prompt_token_gap", "cached_token_gap"):
        assert checks[name]["ok"] and checks[name]["value"] == 0.0, (name, checks[name])
    record = json.loads((rd / "cell.json").read_text())
    assert record["scaleout"]["mode"] == "pd"
    assert [r["role"] for r in record["scaleout"]["replicas"]] == ["prefill", "prefill", "decode"]
    for name in ("server.log", "server.p0.log", "server.p1.log", "router.log", "server_metrics.p0.csv",
                 "server_metrics.p1.csv", "server_metrics.d0.csv", "server_metrics.prefill.csv"):  # fmt: skip
        assert (rd / name).stat().st_size > 0, name
    # Every file the cell left is declared by the result directory's owner, and reads back through it.
    for path in rd.iterdir():
        result_file(path.name)
    typed = read_cell_record(rd)
    assert typed is not None and typed.parse_cell().shape_label == "p2x1-d1x1"
    routed = read_router(rd)
    assert routed is not None and routed.mode == "pd" and routed.requests_by_decode is not None
    ok = summary["counts"]["ok"]
    decode, prefill = _last(rd / "server_metrics.csv"), _last(rd / "server_metrics.prefill.csv")
    assert ok > 0
    assert float(decode["requests_finished_total"]) >= ok  # the decode finished every answered request
    # Every request was prefilled once on one of the prefill instances (and the prompt reused there).
    assert float(prefill["prompt_tokens_total"]) == pytest.approx(
        float(decode["prompt_tokens_total"]), rel=0.05
    )
    assert float(prefill["prefix_cache_hits_total"]) > 0
    router = json.loads((rd / "router.json").read_text())
    assert router["mode"] == "pd"
    assert all(n > 0 for n in router["requests_by_prefill"])  # round robin over both prefill instances
    assert sum(router["requests_by_decode"]) >= ok
    with (rd / "router_metrics.csv").open(newline="") as fh:
        series = list(csv.DictReader(fh))
    assert list(series[0]) == ["time_s", "requests.p0", "requests.p1", "requests.d0"]
    assert [float(series[-1][f"requests.{n}"]) for n in ("p0", "p1")] == router["requests_by_prefill"]
    assert float(series[-1]["requests.d0"]) == router["requests_by_decode"][0]
