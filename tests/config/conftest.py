"""Fixtures for the config/matrix tests: run the real `agentsweep` CLI in-process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from agentsweep.cli import main


@dataclass
class Result:
    rc: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # On GitHub Actions errors become ::error:: annotations; these tests check the plain line.
    for name in ("GITHUB_ACTIONS", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "AGENTSWEEP_RUNNERS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    def run(*argv: str) -> Result:
        rc = main(["matrix", *argv])
        captured = capsys.readouterr()
        return Result(rc, captured.out, captured.err)

    return run


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in tmp_path so errors name files as plain relative paths."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
