"""Child processes of a cell (engine, scraper, replayer), each in its own process group.

Stopping always means SIGTERM to the whole group, a grace period, then SIGKILL to the group, so an
engine's worker processes never outlive the cell. Each child also gets SIGTERM when the cell process
dies (parent-death signal), and its group is handed to the cell's watchdog when there is one. The
engine additionally has a bounded health wait that fails early, with the last log lines, when the
engine process dies while loading.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from agentsweep.cell.stop import raise_if_stopped
from agentsweep.errors import RunError
from agentsweep.watchdog import Watchdog, die_with_parent

LOG_MAX_BYTES = 4 * 1024 * 1024
LOG_HEAD_BYTES = 256 * 1024
_ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b:|\bFATAL\b|\bfatal error\b|Killed")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EngineFailed(RunError):
    """The engine never became healthy, or died; the message is one line fit for status.txt."""


class ManagedProcess:
    """A child process started in a new session, its output appended to ``log_path``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        name: str,
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = 10.0,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.name = name
        self.env = dict(env) if env is not None else None
        self.stop_grace_s = stop_grace_s
        self.watchdog = watchdog
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                )
            except OSError as err:
                raise EngineFailed(f"cannot start the {self.name} ({self.argv[0]}): {err.strerror}") from None
        if self.watchdog is not None:
            self.watchdog.watch(self.proc.pid, self.stop_grace_s)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Exit status, or None if still running after ``timeout_s``."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def signal_group(self, sig: signal.Signals) -> bool:
        """Send ``sig`` to the process group; False when the group is gone."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - pid reused by someone else's process
            return False
        return True

    def group_alive(self) -> bool:
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM the group, wait up to ``grace_s`` for it to empty, then SIGKILL it. Returns the exit status."""
        if self.proc is None:
            return None
        grace = self.stop_grace_s if grace_s is None else grace_s
        deadline = time.monotonic() + grace
        if self.signal_group(signal.SIGTERM):
            while time.monotonic() < deadline:
                if self.proc.poll() is not None and not self.group_alive():
                    break  # leader reaped and no group member left
                time.sleep(0.05)
            else:
                self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        # A leader that exited on SIGTERM may leave children behind: make sure the group is gone.
        self.signal_group(signal.SIGKILL)
        return self.proc.poll()

    def last_lines(self, n: int = 20) -> list[str]:
        return tail_lines(self.log_path, n)

    def __enter__(self) -> ManagedProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class EngineProcess(ManagedProcess):
    """The inference engine: a ManagedProcess with a health URL."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        base_url: str,
        health_path: str = "/health",
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = 30.0,
        watchdog: Watchdog | None = None,
    ) -> None:
        super().__init__(
            argv, log_path=log_path, name="engine", env=env, stop_grace_s=stop_grace_s, watchdog=watchdog
        )
        self.base_url = base_url.rstrip("/")
        self.health_url = self.base_url + health_path

    def __enter__(self) -> EngineProcess:
        if self.proc is None:
            self.start()
        return self

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.2) -> float:
        """Block until the health URL answers 200; seconds waited. Fails early if the engine dies."""
        start = time.monotonic()
        deadline = start + timeout_s
        last_error = "no answer yet"
        while True:
            raise_if_stopped()
            code = self.poll()
            if code is not None:
                raise EngineFailed(
                    f"engine exited with status {code} before becoming healthy{self._last_line_hint()}"
                )
            status, last_error = probe(
                self.health_url, timeout_s=min(2.0, max(0.1, deadline - time.monotonic()))
            )
            if status == 200:
                return time.monotonic() - start
            if time.monotonic() >= deadline:
                raise EngineFailed(
                    f"engine not healthy after {timeout_s:g} s ({self.health_url}: {last_error})"
                    f"{self._last_line_hint()}"
                )
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    def died_reason(self) -> str | None:
        code = self.poll()
        if code is None:
            return None
        return f"engine exited with status {code} during the replay{self._last_line_hint()}"

    def _last_line_hint(self) -> str:
        """The most telling recent log line: the last error line when there is one, else the last line."""
        lines = [ln.strip() for ln in self.last_lines(200) if ln.strip()]
        if not lines:
            return "; server.log is empty"
        errors = [ln for ln in lines if _ERROR_LINE.search(ln)]
        if errors:
            return f"; last error in server.log: {errors[-1][:300]}"
        return f"; last log line: {lines[-1][:300]}"


def probe(url: str, timeout_s: float = 2.0) -> tuple[int | None, str]:
    """GET ``url`` without proxies: (HTTP status or None, short description)."""
    try:
        with _NO_PROXY.open(url, timeout=timeout_s) as resp:
            return resp.status, f"HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        return err.code, f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return None, str(reason)


def tail_lines(path: Path, n: int, chunk: int = 64 * 1024) -> list[str]:
    """The last ``n`` lines of a (possibly large) text file, reading only its end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - chunk))
            data = fh.read()
    except FileNotFoundError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-n:]


def trim_log(path: Path, max_bytes: int = LOG_MAX_BYTES, head_bytes: int = LOG_HEAD_BYTES) -> bool:
    """Keep a log's head (start-up) and tail (the end) when it grew past ``max_bytes``. True if trimmed."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size <= max_bytes:
        return False
    tail_bytes = max_bytes - head_bytes
    with open(path, "rb") as fh:
        head = fh.read(head_bytes)
        head = head[: head.rfind(b"\n") + 1] or head
        fh.seek(size - tail_bytes)
        tail = fh.read()
        nl = tail.find(b"\n")
        tail = tail[nl + 1 :] if nl >= 0 else tail
    omitted = size - len(head) - len(tail)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(head)
            out.write(f"[... {omitted} bytes omitted to keep this log bounded ...]\n".encode())
            out.write(tail)
        os.replace(tmp, path)
    except OSError as err:  # a full disk: the log stays whole, no temporary file stays behind
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err
    return True


def log_size(path: Path) -> int:
    """The size of a log now (0 when absent): where a later ``copy_log_section`` starts."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def copy_log_section(
    src: Path, dst: Path, start: int, max_bytes: int = LOG_MAX_BYTES, head_bytes: int = LOG_HEAD_BYTES
) -> None:
    """``dst``: the head of the log ``src`` (the engine's start-up, where its KV pool is stated), then
    what it wrote from byte ``start`` on (the tail of that when longer than ``max_bytes``).

    A capacity cell's engine runs for every step; each step's result directory keeps the part of its
    log that step saw, behind the start-up lines, like the server.log of a cell of its own.
    """
    try:
        with open(src, "rb") as fh:
            head = fh.read(head_bytes)
            size = fh.seek(0, os.SEEK_END)
            start = min(max(start, len(head)), size)
            fh.seek(max(start, size - (max_bytes - head_bytes)))
            section = fh.read()
    except FileNotFoundError:
        return
    head = head[: head.rfind(b"\n") + 1] or head
    skipped = size - len(section) - len(head)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "wb") as out:
        out.write(head)
        if skipped > 0:
            out.write(f"[... {skipped} bytes of the engine's log before this step omitted ...]\n".encode())
        out.write(section)
