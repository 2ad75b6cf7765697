"""Fixtures for scale-out tests: simulated engine replicas on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import served_url, wait_for_http

MODEL = "meta-llama/Llama-3.3-70B-Instruct"


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group (the router's and engine's children too), SIGKILL after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture
def start_process(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a process (its output in a log under tmp_path); every one is stopped at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], name: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in reversed(procs):
        stop_group(proc)


@pytest.fixture
def sim_replicas(tmp_path: Path, start_process: Callable[..., subprocess.Popen[bytes]]) -> list[str]:
    """Two simulated engines, healthy; their base URLs."""
    argv = [sys.executable, "-m", "agentsweep.cli", "engine-sim", MODEL, "--port", "0"]
    argv += ["--speed", "50", "--quantization", "fp8"]
    procs = [start_process(argv, f"replica{i}") for i in range(2)]
    urls = []
    for i, proc in enumerate(procs):
        url = served_url(tmp_path / f"replica{i}.log", proc)
        wait_for_http(url + "/health", process=proc)
        urls.append(url)
    return urls
