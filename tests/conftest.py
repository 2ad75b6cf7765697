"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_TRACES = REPO_ROOT / "kv-cache-tester" / "sample_traces"


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def sample_traces() -> Path:
    return SAMPLE_TRACES
