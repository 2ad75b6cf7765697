"""Shared pytest fixtures."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
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


class MarkedTree:
    """Processes found by a marker in their environment (children inherit it), so what a test
    leaves behind is found by listing /proc, whatever session or process group it moved to."""

    VAR = "AGENTSWEEP_TEST_TREE"

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex

    @property
    def env(self) -> dict[str, str]:
        """The variable to start the test's processes with."""
        return {self.VAR: self.tag}

    def marked(self) -> dict[int, str]:
        """pid -> command line of every live (non-zombie) process carrying the marker."""
        found: dict[int, str] = {}
        needle = f"{self.VAR}={self.tag}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if needle not in (entry / "environ").read_bytes().split(b"\0"):
                    continue
                if "\nState:\tZ" in (entry / "status").read_text():
                    continue
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (FileNotFoundError, PermissionError, ProcessLookupError):
                continue
        return found

    def wait_until_gone(self, seconds: float) -> dict[int, str]:
        """What is still alive after ``seconds`` (empty once every marked process has ended)."""
        deadline = time.monotonic() + seconds
        left = self.marked()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.marked()
        return left

    def kill(self) -> None:
        for pid in self.marked():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def process_tree() -> Iterator[MarkedTree]:
    """A marker for the processes a test starts; whatever carries it is killed at teardown."""
    tree = MarkedTree()
    yield tree
    tree.kill()
