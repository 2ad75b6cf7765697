"""The processes tests start: stopping them, finding what they leave behind, a simulated engine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .waits import poll_until, wait_for_line


def pid_running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie left for an init that does not reap counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def stop_process(proc: subprocess.Popen[Any]) -> None:
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
def running_engine_sim(*flags: str, model: str = "sim-model", timeout: float = 60.0) -> Iterator[str]:
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
        started = wait_for_line(
            proc.stdout, r"running on (http://127\.0\.0\.1:\d+)", timeout=timeout, what="engine-sim to start"
        )
        yield started.match.group(1)
    finally:
        stop_process(proc)


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
        left = self.marked()

        def gone() -> bool:
            nonlocal left
            left = self.marked()
            return not left

        if left:
            poll_until(gone, timeout=seconds, interval=0.1)
        return left

    def kill(self) -> None:
        for pid in self.marked():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
