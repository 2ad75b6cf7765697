"""Bad input to the accuracy gate: one line naming the option, exit 2, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep import cli
from agentsweep.accuracy.harness import subset
from agentsweep.accuracy.score import Score, wilson_interval
from agentsweep.contract.accuracy import TASKS, AccuracySpec

BASE = ["accuracy", "--endpoint", "http://127.0.0.1:1", "--model", "m", "-o", "out"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--task", "gsm9k"], "input error: accuracy --task: unknown task 'gsm9k'; known: gsm8k"),
        (
            ["--threshold", "1.5"],
            "input error: accuracy --threshold: must be <= 1.0, got 1.5",
        ),
        (
            ["--threshold", "-0.1"],
            "input error: accuracy --threshold: must be >= 0.0, got -0.1",
        ),
        (["--limit", "0"], "input error: accuracy --limit: must be > 0, got 0"),
        (
            ["--num-fewshot", "-1"],
            "input error: accuracy --num-fewshot: must be >= 0, got -1",
        ),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(extra, expected, capsys):
    assert cli.main([*BASE, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [expected]


def test_a_missing_harness_names_its_setup_script(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("AGENTSWEEP_LMEVAL_VENV", str(tmp_path / "no-venv"))
    assert cli.main(BASE) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("input error: the accuracy harness (lm-eval 0.4.13) is not installed in ")
    assert "scripts/accuracy/setup_venv.sh" in line


def test_the_setup_script_installs_the_version_the_gate_runs():
    from agentsweep.accuracy.harness import HARNESS_VERSION

    script = (Path(__file__).resolve().parents[2] / "scripts" / "accuracy" / "setup_venv.sh").read_text()
    assert f'LMEVAL_VERSION="${{LMEVAL_VERSION:-{HARNESS_VERSION}}}"' in script


def test_defaults_come_from_the_task_table():
    spec = AccuracySpec()
    assert spec.threshold_for(None)[0] == TASKS["gsm8k"].threshold == 0.90
    assert spec.effective_fewshot == 5
    assert AccuracySpec(threshold=0.5, num_fewshot=0).threshold_for(None)[0] == 0.5


def test_the_wilson_interval_holds_its_known_values():
    # 41 of 100 right: 0.3187-0.5080 (Wilson, z = 1.96; SciPy's binomtest(41, 100).proportion_ci
    # (method="wilson") gives the same).
    low, high = wilson_interval(41, 100)
    assert (round(low, 4), round(high, 4)) == (0.3187, 0.5080)
    assert wilson_interval(0, 10)[0] == pytest.approx(0.0, abs=1e-12)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0, abs=1e-12)
    score = Score("gsm8k", 41, 100, 0.90)
    assert not score.passed
    assert score.line() == "gsm8k 0.41 < 0.90 over 100 questions, 95% CI 0.32-0.51"


def test_a_limit_draws_a_seeded_sorted_subset():
    a, b, c = subset(1319, 250, 1), subset(1319, 250, 1), subset(1319, 250, 2)
    assert a is not None and len(a) == 250 == len(set(a)) and a == sorted(a)
    assert a == b != c
    assert subset(1319, None, 1) is None and subset(100, 100, 1) is None  # every question


def test_the_answers_file_reads_through_its_owner_and_a_broken_line_is_named(tmp_path):
    from agentsweep.accuracy.harness import read_answers
    from agentsweep.errors import ResultFileError

    assert read_answers(tmp_path) == []
    good = {
        "doc_id": 3,
        "question": "q",
        "target": "4",
        "response": "#### 4",
        "extracted": "4",
        "correct": True,
    }
    (tmp_path / "accuracy.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({"doc_id": 4}) + "\n")
    with pytest.raises(ResultFileError, match=r"^accuracy.jsonl: line 2: "):
        read_answers(tmp_path)
    (tmp_path / "accuracy.jsonl").write_text(json.dumps(good) + "\n")
    (answer,) = read_answers(tmp_path)
    assert answer.doc_id == 3 and answer.correct is True
