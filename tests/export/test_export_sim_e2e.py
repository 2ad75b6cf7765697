"""export on a real local cell (simulated engine, scraper, replayer, power sampler): the rows validate
against the shipped schemas, the nested row flattens to the flat one, interactivity and throughput per
GPU computed by hand from requests.jsonl equal the exported values, and the power fields are collect's
under InferenceX's names (schema 2: per GPU, the cell's total beside it)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR
from agentsweep.export.build import nested_row
from agentsweep.export.cli import points
from agentsweep.export.models import flatten, row_json
from jsonschema import Draft202012Validator

pytestmark = pytest.mark.slow
SPEED = 50
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cell_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo_root = REPO_ROOT
    results = tmp_path_factory.mktemp("export")
    exp = "exp-tp2-ep1-u4-on"
    cell = {
        "config_key": "exp",
        "exp_name": exp,
        "runner": "local",
        "engine": "sim",
        "hardware": "h200",
        "model": "meta-llama/Llama-3.3-70B-Instruct",
        "precision": "fp8",
        "tp": 2,
        "users": 4,
        "offload": "on",
        "cpu_dram_gb": 64,
        "duration": 6,
        "traces": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "max_context": 32768,
        "max_delay": 1,
        # What this test checks is not run validity: room for a CI machine busy with other tests.
        "min_window_coverage": 0.5,
        "max_dispatch_lag_p99_s": 2.0,
        "max_lane_idle_s": 60.0,  # 11 s by default: 0.22 s of wall time at this speed
        "speed": SPEED,
        # The local runner's power facts: the sampler reads the simulated engine's DCGM metrics.
        "power_source": "dcgm",
        "power_endpoint": "engine",
    }
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    proc = subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "30"],
        env={**env, CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(results / exp)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results / exp


def _export(cell_dir: Path, out: Path, shape: str) -> dict:
    args = ["export", "--format", "inferencex", str(cell_dir.parent), "-o", str(out), "--shape", shape]
    assert main([*args, "--include-invalid"]) == 0
    rows = json.loads((out / "results_bmk" / "agg_bmk.json").read_text())
    assert len(rows) == 1
    assert json.loads((out / f"bmk_agentic_{cell_dir.name}" / f"{cell_dir.name}.json").read_text()) == rows[0]
    return rows[0]


def test_both_shapes_validate_and_the_nested_row_flattens_to_the_flat_row(cell_dir, repo_root, tmp_path):
    flat = _export(cell_dir, tmp_path / "flat", "flat")
    nested = _export(cell_dir, tmp_path / "nested", "nested")
    schemas = repo_root / "utils" / "agentsweep" / "export" / "schemas"
    for row, name in ((flat, "agentx-flat-v2"), (nested, "agentx-v2")):
        schema = json.loads((schemas / f"{name}.schema.json").read_text())
        assert list(Draft202012Validator(schema).iter_errors(row)) == []
    (point,) = points(cell_dir.parent, include_invalid=True)
    assert row_json(flatten(nested_row(point))) == flat
    assert nested["schema"] == "agentx-v2" and flat["schema"] == "agentx-flat-v2"
    assert flat["num_gpus"] == 2 and flat["conc"] == 4
    stability = nested["request_metrics"]["stability"]
    assert stability["expected_window_count"] == 3 and 1 <= stability["observed_window_count"] <= 3


def test_interactivity_and_throughput_per_gpu_by_hand_from_requests_jsonl(cell_dir, tmp_path):
    flat = _export(cell_dir, tmp_path / "flat", "flat")
    summary = json.loads((cell_dir / "summary.json").read_text())
    window = summary["window"]
    records = [json.loads(line) for line in (cell_dir / "requests.jsonl").read_text().splitlines()]
    ok = [r for r in records if r["phase"] == "profile" and r["status"] == "ok"]
    # Full-response ITL per request, in the engine's clock: from the timeline the simulated engine
    # stated for each request (collect reports a simulated cell's latencies in its engine's clock).
    engine = [r["engine"] for r in ok]
    assert all(e["speed"] == SPEED for e in engine)
    itls = [
        (e["e2e_s"] - e["ttft_s"]) / (e["output_tokens"] - 1)
        for e in engine
        if e["output_tokens"] >= 2 and e["ttft_s"] is not None
    ]
    assert len(itls) >= 10
    for pct, key in ((50, "median_intvty"), (90, "p90_intvty"), (99, "p99_intvty")):
        assert flat[key] == pytest.approx(1 / np.percentile(itls, pct), rel=1e-9)
    assert flat["p90_intvty"] < flat["median_intvty"]  # the slow tail
    # E2E-normalised interactivity: 1 / pXX of E2E per output token, the engine's E2E and tokens.
    per_token = [e["e2e_s"] / e["output_tokens"] for e in engine if e["output_tokens"] >= 1]
    for pct, key in ((50, "median_e2e_norm_intvty"), (90, "p90_e2e_norm_intvty")):
        assert flat[key] == pytest.approx(1 / np.percentile(per_token, pct), rel=1e-9)
    assert flat["p90_e2e_norm_intvty"] < flat["p90_intvty"]  # it charges each request its TTFT
    # Throughput per GPU: prompt (cached included) + output tokens of the requests that finished in
    # the steady window, per engine second, over both GPUs.
    inside = [r for r in ok if window["start_s"] <= r["t_done"] <= window["end_s"]]
    tokens = sum(r["prompt_tokens"] + r["output_tokens"] for r in inside)
    engine_seconds = (window["end_s"] - window["start_s"]) * SPEED
    assert flat["tput_per_gpu"] == pytest.approx(tokens / engine_seconds / 2, rel=1e-9)
    assert flat["output_tput_per_gpu"] == pytest.approx(
        sum(r["output_tokens"] for r in inside) / engine_seconds / 2, rel=1e-9
    )
    assert flat["duration_seconds"] == pytest.approx(engine_seconds, rel=1e-9)


def test_power_fields_are_collects_summary_csv_figures(cell_dir, tmp_path):
    flat = _export(cell_dir, tmp_path / "flat", "flat")
    nested = _export(cell_dir, tmp_path / "nested", "nested")
    assert main(["collect", str(cell_dir.parent), str(tmp_path / "agg"), "--no-plots"]) == 0
    with (tmp_path / "agg" / "summary.csv").open(newline="") as f:
        (row,) = [r for r in csv.DictReader(f) if r["exp_name"] == cell_dir.name]
    assert float(row["power_valid"]) == 1.0 and flat["power_valid"] == 1
    assert flat["joules_per_output_token"] > 0
    assert flat["joules_per_output_token"] == float(row["joules_per_output_token"])
    assert flat["total_gpu_energy_j"] == float(row["total_gpu_energy_j"])
    assert flat["avg_power_w"] == float(row["avg_power_per_gpu_w"])  # per GPU; the cell's beside it
    assert flat["avg_total_gpu_power_w"] == float(row["avg_power_w"])
    assert flat["power_invalid_reasons"] == json.loads(row["power_reason_codes"]) == []
    audit = json.loads(row["power_audit"])
    assert flat["power_audit"]["sample_count"] == audit["samples"]
    assert flat["power_audit"]["observed_gpu_count"] == flat["power_audit"]["expected_gpu_count"] == 2
    assert nested["power_valid"] == 1 and nested["joules_per_output_token"] == flat["joules_per_output_token"]


def test_a_simulated_cell_says_its_accuracy_was_not_measured_and_exports_no_eval(cell_dir, tmp_path):
    summary = json.loads((cell_dir / "summary.json").read_text())
    assert summary["accuracy"] == {
        "outcome": "not measured",
        "task": "gsm8k",
        "reason": "accuracy not measured (simulated engine)",
    }
    assert "accuracy" not in summary["validity"]["checks"] and not (cell_dir / "accuracy.json").exists()
    _export(cell_dir, tmp_path / "flat", "flat")
    assert not [p for p in (tmp_path / "flat").iterdir() if p.name.startswith("eval_")]
