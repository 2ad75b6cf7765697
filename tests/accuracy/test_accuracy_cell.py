"""The accuracy gate in a cell: the config's ``accuracy:`` block and its bad values (one line at the
matrix, exit 2), a harness or questions that are missing (one line at the cell, exit 2, before any
engine starts), the dry run's line, and the real harness against the real simulated engine forced on
(its filler answers score near zero: INVALID with the score's line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agentsweep.accuracy.harness import default_venv
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR

from tests.accuracy.conftest import write_questions

REPO = Path(__file__).resolve().parents[2]
ENTRY = textwrap.dedent(
    """\
    k:
      runner: local
      engine: {engine}
      model: m
      precision: fp8
      image: {image}
      duration: 10
      traces: t
      accuracy: {accuracy}
      search_space:
        tp1: {{users: [1], offload: [off]}}
    """
)
SIM_CELL = {
    "exp_name": "gate", "runner": "local", "engine": "sim", "hardware": "h200",
    "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "tp": 1, "users": 2,
    "offload": "off", "duration": 4, "speed": 50, "max_context": 24576, "max_delay": 1,
    "traces": str(REPO / "kv-cache-tester" / "sample_traces"),
    "min_window_coverage": 0.3, "max_dispatch_lag_p99_s": 2.0, "min_window_requests": 1,
}  # fmt: skip


def matrix(tmp_path: Path, capsys: pytest.CaptureFixture[str], accuracy: str, engine: str = "sim") -> tuple:
    image = "vllm/vllm-openai:v0.11.0" if engine != "sim" else '""'
    (tmp_path / "c.yaml").write_text(ENTRY.format(engine=engine, image=image, accuracy=accuracy))
    code = main(["matrix", "--config", str(tmp_path / "c.yaml"), "--key", "k", "--json"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("accuracy", "expected"),
    [
        ("{task: gsm9k}", "k.accuracy.task: unknown task 'gsm9k'; known: gsm8k"),
        ("{threshold: 1.5}", "k.accuracy.threshold: "),
        ("{limit: 0}", "k.accuracy.limit: "),
        ("{thresold: 0.5}", "k.accuracy.thresold: "),
        ("sometimes", "k.accuracy"),
    ],
)
def test_a_bad_accuracy_block_is_one_line_at_the_matrix(tmp_path, capsys, accuracy, expected):
    code, out, err = matrix(tmp_path, capsys, accuracy)
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1, err
    assert expected in err, err


@pytest.mark.parametrize(
    ("accuracy", "run", "limit"), [("off", "off", 250), ("on", "on", 250), ("{limit: 40}", "auto", 40)]
)
def test_the_block_reaches_every_cell(tmp_path, capsys, accuracy, run, limit):
    code, out, err = matrix(tmp_path, capsys, accuracy)
    assert code == 0, err
    (cell,) = json.loads(out)["include"]
    assert cell["accuracy"]["run"] == run and cell["accuracy"]["limit"] == limit


def _cell(cell: dict, result_dir: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "cell", *extra],
        env={**base, **(env or {}), CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(result_dir)},
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


@pytest.mark.integration
def test_the_dry_run_says_the_task_the_questions_the_threshold_and_the_time(tmp_path):
    real = {**SIM_CELL, "engine": "vllm", "speed": 1, "model": "deepseek-ai/DeepSeek-R1-0528"}
    proc = _cell(real, tmp_path / "r", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("accuracy:")]
    assert line.startswith("accuracy: gsm8k 5-shot, 250 questions (seed 1234), threshold 0.91 ")
    assert "thresholds.yaml models.dsr1" in line and "about 125 s, at most 600 s" in line
    proc = _cell(SIM_CELL, tmp_path / "s", "--dry-run")
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("accuracy:")]
    assert line == "accuracy: not run, accuracy not measured (simulated engine) (accuracy: on forces it)"


@pytest.mark.integration
def test_a_missing_harness_or_missing_questions_refuse_the_cell_before_it_starts(tmp_path):
    forced = {**SIM_CELL, "accuracy": {"run": "on"}}
    proc = _cell(forced, tmp_path / "a", env={"AGENTSWEEP_LMEVAL_VENV": str(tmp_path / "none")})
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "is not installed in" in line and "scripts/accuracy/setup_venv.sh" in line
    assert not (tmp_path / "a" / "server.log").exists()  # no engine started
    if not (default_venv() / "bin" / "lm_eval").is_file():
        return
    nowhere = {**SIM_CELL, "accuracy": {"run": "on", "data": str(tmp_path / "nowhere")}}
    proc = _cell(nowhere, tmp_path / "b")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.endswith(f"cell gate: accuracy.data {tmp_path / 'nowhere'}: not a directory")
    half = write_questions(tmp_path / "half", test=3)
    (half / "test.jsonl").unlink()  # a question set without its test split: refused, never a traceback
    proc = _cell({**SIM_CELL, "accuracy": {"run": "on", "data": str(half)}}, tmp_path / "c")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.endswith(f"cell gate: accuracy.data {half}: no test.jsonl")
    assert not (tmp_path / "c" / "server.log").exists()


@pytest.mark.integration
@pytest.mark.slow
def test_the_simulated_engine_forced_through_the_gate_scores_near_zero_and_is_invalid(tmp_path):
    if not (default_venv() / "bin" / "lm_eval").is_file():
        pytest.skip("lm-eval is not installed: run scripts/accuracy/setup_venv.sh")
    data = write_questions(tmp_path / "data", test=12)
    cell = {**SIM_CELL, "accuracy": {"run": "on", "data": str(data), "limit": 12, "num_fewshot": 1}}
    proc = _cell(cell, tmp_path / "r", "--health-timeout", "60")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    record = json.loads((tmp_path / "r" / "accuracy.json").read_text())
    assert record["outcome"] == "failed" and record["questions"] == 12 and record["score"] <= 0.1
    status = (tmp_path / "r" / "status.txt").read_text().splitlines()
    assert status[0] == "INVALID" and f"accuracy: {record['reason']}" in status[1:]
    assert record["reason"].startswith("gsm8k 0.0") and "< 0.90 over 12 questions" in record["reason"]


def test_the_allocation_keeps_the_gates_budget():
    from agentsweep.cell.allocation import cell_time_limit_min
    from agentsweep.contract.cell import Cell

    base = {**SIM_CELL, "engine": "vllm", "speed": 1, "duration": 600}
    gated = Cell.parse({**base, "accuracy": {"timeout_s": 900}})
    off = Cell.parse({**base, "accuracy": "off"})
    assert cell_time_limit_min(gated, {}, 240) - cell_time_limit_min(off, {}, 240) == 15
    simulated = Cell.parse({**SIM_CELL, "duration": 600})  # not measured: nothing kept for it
    assert cell_time_limit_min(simulated, {}, 240) == cell_time_limit_min(
        simulated.replace(accuracy="off"), {}, 240
    )
