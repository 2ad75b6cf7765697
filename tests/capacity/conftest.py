"""Fixtures of the capacity tests: the real `agentsweep` CLI in-process, a config entry to vary."""

from __future__ import annotations

import textwrap
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


@pytest.fixture
def agentsweep(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    for name in ("GITHUB_ACTIONS", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "AGENTSWEEP_RUNNERS"):
        monkeypatch.delenv(name, raising=False)

    def run(*argv: str) -> Result:
        rc = main(list(argv))
        captured = capsys.readouterr()
        return Result(rc, captured.out, captured.err)

    return run


ENTRY = """\
k:
  runner: local
  engine: sim
  model: meta-llama/Llama-3.3-70B-Instruct
  precision: fp8
  duration: {duration}
  speed: 50
  traces: kv-cache-tester/sample_traces
{extra}  search_space:
    tp1: {{users: {users}, offload: [off]}}
"""


def entry(users: str = "{search: [2, 16]}", extra: str = "", duration: int = 10) -> str:
    """A config entry `k` whose point's users are ``users``; ``extra`` adds entry fields."""
    indented = textwrap.indent(textwrap.dedent(extra), "  ") if extra else ""
    return ENTRY.format(users=users, extra=indented, duration=duration)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in tmp_path so errors name files as plain relative paths."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
