"""Parent-death handling for the process trees a cell, a sweep, a power sampler or a calibration starts
(below every part that starts processes: it imports nothing of agentsweep).

Two layers, so that killing ``agentsweep cell`` outright (SIGKILL, the OOM killer) leaves nothing behind:

* every child a cell or a sweep starts gets a parent-death signal (``prctl(PR_SET_PDEATHSIG)``): when
  the process that started it dies, the kernel sends it SIGTERM;
* the cell starts this module as a watchdog in a session of its own, tells it each child's process
  group on a pipe, and closes the pipe with ``done`` once it has stopped them itself. When the pipe
  closes without ``done`` the cell died: the watchdog SIGTERMs every group it was told about, waits
  each one's grace period and SIGKILLs what is left (an engine's workers included, which no
  parent-death signal reaches). It holds an exclusive ``flock`` on the result directory until then,
  so ``benchmarks/run_cell.sh`` writes its FAILED verdict only after the last child stopped writing.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

PR_SET_PDEATHSIG = 1
# The signals that stop a cell (its verdict still written): a user's Ctrl-C, a job's end, a lost terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_libc: ctypes.CDLL | None = None


@contextlib.contextmanager
def stop_on_signal(
    stop: threading.Event, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
) -> Iterator[None]:
    """Around a reader process's main loop (a metrics collector, a power sampler): the first of
    ``signals`` sets ``stop``, and every later one is ignored from then on. A stopper sends SIGTERM to
    the process group and then again (``ManagedProcess.stop``); the second must not kill the reader
    while it writes its last row and closes its file, nor as Python exits, when the default action is
    back for a handler written in Python (but not for an ignored signal). Without a stop signal (the
    loop ended on its own, or ran in a caller's process) the previous handlers are put back."""
    received: list[int] = []

    def _stop(signum: int, _frame: object) -> None:
        received.append(signum)
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        # Not stop.set() here: the handler runs in the main thread between two bytecodes, possibly
        # while that thread holds the event's own lock inside stop.wait(), and set() would then wait
        # for that lock forever. Another thread sets it once the main thread lets the lock go.
        threading.Thread(target=stop.set, name="stop-signal", daemon=True).start()

    previous = {sig: signal.signal(sig, _stop) for sig in signals}
    try:
        yield
    finally:
        if not received:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _prctl() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def set_parent_death_signal(sig: int = signal.SIGTERM, parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies; False where unsupported.

    ``parent`` is the pid expected as parent: if it already died (a race with the fork), ``sig`` is
    sent at once.
    """
    libc = _prctl()
    if libc is None:
        return False
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for Popen: the child gets ``sig`` when the process that started it dies."""
    if _prctl() is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        set_parent_death_signal(sig, parent)

    return preexec


class Watchdog:
    """The cell's side of the watchdog: start it, register process groups, dismiss it."""

    def __init__(self, result_dir: Path, python: str = sys.executable) -> None:
        self.result_dir = result_dir
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Watchdog:
        env = dict(os.environ)
        utils = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = utils + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [self.python, "-m", "agentsweep.watchdog", str(self.result_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a signal to the cell's process group does not reach it
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()  # the lock is held from here on
        if ready.strip() != b"ready":
            self.proc.wait()
            self.proc = None
        return self

    def watch(self, pgid: int, grace_s: float) -> None:
        self._send(f"watch {pgid} {grace_s:g}\n")

    def dismiss(self) -> None:
        """Every child was stopped by the cell: the watchdog exits without touching anything."""
        self._send("done\n")
        if self.proc is not None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None

    def _send(self, line: str) -> None:
        if self.proc is None or self.proc.stdin is None:
            return
        with contextlib.suppress(OSError):  # a watchdog that died is only a lost safety net
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_groups(groups: dict[int, float], poll_s: float = 0.05) -> None:
    """SIGTERM every group, then SIGKILL each one still alive after its grace period."""
    start = time.monotonic()
    for pgid in groups:
        _killpg(pgid, signal.SIGTERM)
    pending = dict(groups)
    while pending:
        now = time.monotonic()
        for pgid, grace in list(pending.items()):
            if not _group_alive(pgid):
                del pending[pgid]
            elif now - start >= grace:
                _killpg(pgid, signal.SIGKILL)
                del pending[pgid]
        time.sleep(poll_s)
    # A SIGKILLed group may take a moment to empty; wait briefly so the lock outlives its writers.
    deadline = time.monotonic() + 5
    while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m agentsweep.watchdog RESULT_DIR", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    lock_fd = -1
    with contextlib.suppress(OSError):
        lock_fd = os.open(args[0], os.O_RDONLY)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    groups: dict[int, float] = {}
    done = False
    for raw in sys.stdin:
        words = raw.split()
        if words == ["done"]:
            done = True
            break
        if len(words) == 3 and words[0] == "watch":
            with contextlib.suppress(ValueError):
                groups[int(words[1])] = float(words[2])
    if not done:
        alive = {g: grace for g, grace in groups.items() if _group_alive(g)}
        if alive:
            print(
                f"watchdog: the cell process died; stopping its {len(alive)} process group(s)",
                file=sys.stderr,
                flush=True,
            )
            stop_groups(alive)
    if lock_fd >= 0:
        os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
