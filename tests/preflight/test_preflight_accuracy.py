"""The accuracy gate's preflight checks: the harness, and each task's questions (a local directory, or
the dataset in a hand-laid HF cache, offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentsweep.contract.cell import Cell
from agentsweep.preflight.accuracy import accuracy_checks

from tests.accuracy.conftest import write_questions
from tests.preflight.test_preflight_hub import lay_cache

BASE = {"exp_name": "x", "model": "m", "tp": 1, "users": 1, "offload": "off", "traces": "t", "duration": 10}
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def cell(engine: str = "vllm", **accuracy: object) -> Cell:
    return Cell.parse({**BASE, "engine": engine, "hardware": "h200", "accuracy": accuracy or {}})


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "lm_eval").write_text("#!/bin/sh\n")
    monkeypatch.setenv("AGENTSWEEP_LMEVAL_VENV", str(venv))
    return venv


def test_simulated_cells_and_cells_with_the_gate_off_are_not_checked():
    (check,) = accuracy_checks([cell("sim"), cell(run="off")], None, OFFLINE)
    assert check.status == "SKIP" and "accuracy not measured" in check.detail


def test_the_dataset_in_the_cache_passes_and_a_missing_one_names_the_download(harness, tmp_path):
    cache = tmp_path / "hub"
    cache.mkdir()
    checks = {c.name: c for c in accuracy_checks([cell()], str(cache), OFFLINE)}
    assert checks["accuracy.harness"].status == "PASS"
    data = checks["accuracy.data.gsm8k"]
    assert data.status == "FAIL" and "HF_HUB_OFFLINE" in data.detail
    assert data.fix == f"hf download openai/gsm8k --repo-type dataset --cache-dir {cache}"
    lay_cache(cache, "openai/gsm8k", {"README.md": b"x" * 100}, repo_type="datasets")
    checks = {c.name: c for c in accuracy_checks([cell()], str(cache), OFFLINE)}
    assert checks["accuracy.data.gsm8k"].status == "PASS"


def test_local_questions_and_a_missing_harness(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTSWEEP_LMEVAL_VENV", str(tmp_path / "none"))
    data = write_questions(tmp_path / "q", test=3)
    checks = {
        c.name: c for c in accuracy_checks([cell(data=str(data)), cell(data=str(tmp_path))], None, OFFLINE)
    }
    harness = checks["accuracy.harness"]
    assert harness.status == "FAIL" and "scripts/accuracy/setup_venv.sh" in harness.fix
    statuses = [c.status for c in accuracy_checks([cell(data=str(data))], None, OFFLINE)[1:]]
    assert statuses == ["PASS"]
    (missing,) = [c for c in accuracy_checks([cell(data=str(tmp_path))], None, OFFLINE) if "data" in c.name]
    assert missing.status == "FAIL" and "no train.jsonl, test.jsonl" in missing.detail
