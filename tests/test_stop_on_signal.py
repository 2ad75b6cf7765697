"""``watchdog.stop_on_signal``: a reader process stops on the first signal and outlives the stopper's
second (``ManagedProcess.stop`` sends SIGTERM to the group and then again)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from agentsweep.watchdog import stop_on_signal

# A process that gets SIGTERM inside the block, then twice more: inside it, and after it as it exits.
READER = textwrap.dedent(
    """
    import os, signal, threading
    from agentsweep.watchdog import stop_on_signal
    stop = threading.Event()
    with stop_on_signal(stop):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        os.kill(os.getpid(), signal.SIGTERM)  # the stopper's second
    os.kill(os.getpid(), signal.SIGINT)  # and one more as the reader writes its last line
    print("stopped once", flush=True)
    """
)


@pytest.mark.integration
def test_the_first_signal_stops_the_reader_and_later_ones_do_not_kill_it() -> None:
    proc = subprocess.run([sys.executable, "-c", READER], capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (0, "stopped once\n"), proc.stderr


def test_without_a_signal_the_previous_handlers_are_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop = threading.Event()
    with stop_on_signal(stop):
        assert signal.getsignal(signal.SIGTERM) not in (before[signal.SIGTERM], signal.SIG_IGN)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert not stop.is_set()
