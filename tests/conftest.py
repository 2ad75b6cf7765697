"""Shared pytest fixtures."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
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


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 10 s; closes the stdout pipe when there is one."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout:
        proc.stdout.close()


@contextlib.contextmanager
def running_engine_sim(*flags: str, model: str = "sim-model") -> Iterator[str]:
    """A real `agentsweep engine-sim` subprocess on a free port; yields its base URL."""
    sim = Path(sys.executable).parent / "agentsweep"
    proc = subprocess.Popen(
        [str(sim), "engine-sim", model, "--host", "127.0.0.1", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    try:
        url = None
        for line in proc.stdout:
            m = re.search(r"running on (http://127\.0\.0\.1:\d+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "engine-sim did not start"
        yield url
    finally:
        stop_process(proc)


@pytest.fixture
def engine_sim_factory():
    """``with engine_sim_factory("--speed", "50") as url:`` runs a real engine-sim subprocess."""
    return running_engine_sim
