"""One sweep per results directory: an exclusive lock on ``<results>/.sweep.lock`` for the sweep's life.

A second sweep into the same results root (even with ``--force``) would delete the first one's running
cell or start its engine beside it, and both would report figures measured on shared cores. The lock
is an ``flock`` on an open file, so the kernel drops it when the sweep ends however it ends (no stale
lock after a kill); the file keeps the holder's pid, host, start time and command line for the
refusal, one line naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from agentsweep.errors import InputError

LOCK_NAME = ".sweep.lock"
HOLDER_MAX_BYTES = 4096


def _holder_line() -> str:
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    command = shlex.join(["agentsweep", *sys.argv[1:]])[:2000]
    return f"pid {os.getpid()} on {socket.gethostname()} since {since}: {command}"


def _holder(fd: int) -> str:
    text = os.pread(fd, HOLDER_MAX_BYTES, 0).decode("utf-8", errors="replace")
    line = text.splitlines()[0] if text.strip() else ""
    return "".join(ch if ch.isprintable() else "?" for ch in line) or "a process that has not said who it is"


@contextlib.contextmanager
def sweep_lock(results: Path) -> Iterator[Path]:
    """Hold ``results``/.sweep.lock while the block runs; a held lock is InputError naming its holder."""
    try:
        results.mkdir(parents=True, exist_ok=True)
        fd = os.open(results / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise InputError(f"--results {results}: cannot lock: {err.strerror or err}") from None
    path = results / LOCK_NAME
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(
                f"--results {results}: another sweep is running into it ({_holder(fd)}); "
                "wait for it to end, stop it, or give another --results"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (_holder_line() + "\n").encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a waiting sweep)
