"""The accuracy gate's harness for real: lm-evaluation-harness (its own virtualenv) against a stand-in
OpenAI-compatible server that answers a known share of GSM8K-format questions right."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from agentsweep.accuracy.harness import default_venv, subset

from tests.accuracy.conftest import write_questions
from tests.accuracy.standin import answers_right

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "agentsweep.cli"]


@pytest.fixture(autouse=True)
def _harness() -> None:
    if not (default_venv() / "bin" / "lm_eval").is_file():
        pytest.skip("lm-eval is not installed: run scripts/accuracy/setup_venv.sh")


def accuracy(url: str, data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "accuracy", "--endpoint", url, "--model", "standin", "--data", str(data), "-o", str(out), *extra],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def test_a_score_under_the_threshold_on_a_seeded_subset_exits_3_and_keeps_every_answer(standin, tmp_path):
    # One harness run (each takes 15-30 s): a passing score is the sweep test's (test_accuracy_sweep).
    data = write_questions(tmp_path / "data", test=160)
    questions = [json.loads(line)["question"] for line in (data / "test.jsonl").read_text().splitlines()]
    proc = accuracy(standin(data, 0.60), data, tmp_path / "out", "--limit", "120", "--seed", "1")
    assert proc.returncode == 3, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "accuracy.json").read_text())
    answers = [json.loads(line) for line in (tmp_path / "out" / "accuracy.jsonl").read_text().splitlines()]
    # The subset asked is the seeded draw, recorded, and not the first 120 questions.
    asked = subset(160, 120, 1)
    assert summary["doc_ids"] == asked and asked != list(range(120))
    assert sorted(a["doc_id"] for a in answers) == asked
    # The harness scored exactly the questions the stand-in answered right.
    assert {a["doc_id"] for a in answers if a["correct"]} == {
        i for i in asked if answers_right(questions[i], 0.60)
    }
    assert summary["questions"] == 120 and summary["correct"] == sum(a["correct"] for a in answers)
    low, high = summary["ci95"]
    assert low <= 0.60 <= high and summary["outcome"] == "failed" and summary["threshold"] == 0.90
    assert summary["num_fewshot"] == 5 and summary["harness"] == "lm-eval 0.4.13"
    assert re.fullmatch(
        r"gsm8k 0\.\d\d < 0\.90 over 120 questions, 95% CI 0\.\d\d-0\.\d\d", summary["reason"]
    ), summary["reason"]
    assert f"accuracy: {summary['reason']} (" in proc.stdout


def test_a_server_that_refuses_every_request_is_a_step_that_could_not_run(tmp_path):
    data = write_questions(tmp_path / "data", test=5)
    proc = accuracy("http://127.0.0.1:9", data, tmp_path / "out", "--timeout", "120")
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("run error: accuracy: lm-eval exited with status 1: "), proc.stderr[-2000:]
    assert "Cannot connect to host 127.0.0.1:9" in line and "File " not in line
    assert not (tmp_path / "out" / "accuracy.json").exists()
