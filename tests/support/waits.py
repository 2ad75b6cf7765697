"""Waiting in tests: poll a condition until it holds or a deadline passes, and say what was awaited."""

from __future__ import annotations

import contextlib
import queue
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NamedTuple, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """What a test waited for did not happen in time (or the process meant to do it ended first)."""


def _ended(process: subprocess.Popen[Any], what: str) -> WaitTimeout:
    out = ""
    if process.stdout is not None:
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            out = process.communicate(timeout=10)[0] or ""
    if isinstance(out, bytes):
        out = out.decode(errors="replace")
    tail = f"\n{out}" if out else ""
    return WaitTimeout(f"the process exited with status {process.returncode} while waiting for {what}{tail}")


def poll_until(
    condition: Callable[[], T],
    *,
    timeout: float,
    interval: float = 0.05,
    process: subprocess.Popen[Any] | None = None,
    what: str = "the condition",
) -> T:
    """Call ``condition`` every ``interval`` s until it returns something true or ``timeout`` s pass;
    return its last value either way (the caller asserts). With ``process``, raise WaitTimeout as soon
    as that process ends (with its output when it has a stdout pipe)."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise _ended(process, what)
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_until(
    condition: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    process: subprocess.Popen[Any] | None = None,
) -> T:
    """Like poll_until, but raise WaitTimeout naming ``what`` when the condition never held."""
    value = poll_until(condition, timeout=timeout, interval=interval, process=process, what=what)
    if not value:
        raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")
    return value


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The status a GET of ``url`` answers, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.close()
        return int(err.code)
    except OSError:
        return None


def wait_for_http(
    url: str,
    *,
    timeout: float = 30.0,
    status: int = 200,
    interval: float = 0.1,
    process: subprocess.Popen[Any] | None = None,
) -> None:
    """Until a GET of ``url`` answers ``status`` (a health endpoint); with ``process``, until the answer
    comes from that process (it, or a process it started, listens on the URL's port) and fail as soon
    as it ends.

    A port picked free may be taken by another test's server before this one binds it: that server
    answers the health check, this one dies of "address in use", and without the owner check the test
    would go on against a server not its own (and send that server its requests)."""
    port = urllib.parse.urlsplit(url).port
    mine = (lambda: True) if process is None or port is None else (lambda: listens_on(process.pid, port))
    wait_until(
        lambda: http_status(url) == status and mine(),
        timeout=timeout,
        interval=interval,
        process=process,
        what=f"{url} to answer {status}" + ("" if process is None else f" from process {process.pid}"),
    )


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` or one of its descendants has a TCP socket listening on ``port``."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for proc in family:
        try:
            sockets = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port for s in sockets):
            return True
    return False


def wait_for_file(
    path: Path,
    *,
    timeout: float,
    nonempty: bool = False,
    interval: float = 0.05,
    process: subprocess.Popen[Any] | None = None,
) -> Path:
    """Until ``path`` exists (and, with ``nonempty``, holds at least one byte)."""

    def there() -> bool:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        return size > 0 or not nonempty

    wait_until(
        there,
        timeout=timeout,
        interval=interval,
        process=process,
        what=f"{path}{' to have content' if nonempty else ' to appear'}",
    )
    return path


class LineFound(NamedTuple):
    match: re.Match[str]
    lines: list[str]  # every line read, the matching one last


def wait_for_line(stream: IO[str], pattern: str, *, timeout: float, what: str) -> LineFound:
    """Read ``stream`` (a process's text stdout) line by line until one matches ``pattern``. Raise
    WaitTimeout with the lines read when the stream ends or ``timeout`` s pass first. Reading stops at
    the matching line, so the rest stays in the pipe."""
    lines: queue.Queue[str | None] = queue.Queue()
    regex = re.compile(pattern)

    def read() -> None:  # readline blocks, so the deadline is kept by the queue, not here
        with contextlib.suppress(ValueError, OSError):  # the stream closed under us
            for line in stream:
                lines.put(line)
                if regex.search(line):
                    return
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise WaitTimeout(
                f"timed out after {timeout:g} s waiting for {what}; read:\n{''.join(seen)}"
            ) from None
        if line is None:
            raise WaitTimeout(f"the output ended before {what}; read:\n{''.join(seen)}")
        seen.append(line)
        match = regex.search(line)
        if match:
            return LineFound(match, seen)


SERVING = re.compile(rb"Uvicorn running on (http://\S+)")


def served_url(log: Path, process: subprocess.Popen[Any], timeout: float = 60.0) -> str:
    """The URL a server started with ``--port 0`` says it serves on, from its log (the simulated engine
    and vLLM print ``Uvicorn running on URL``): the port it bound itself, which no other test's server
    can hold."""

    def said() -> str | None:
        found = SERVING.search(log.read_bytes()) if log.exists() else None
        return found.group(1).decode() if found else None

    return wait_until(said, timeout=timeout, process=process, what=f"{log.name} to say where it serves")
