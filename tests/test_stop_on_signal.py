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


# The signal lands while the main thread holds the event's own lock, as it does for a few bytecodes
# of every stop.wait(): a handler that set the event itself would wait for that lock forever.
INSIDE_WAIT = textwrap.dedent(
    """
    import os, signal, threading
    from agentsweep.watchdog import stop_on_signal
    stop = threading.Event()
    with stop_on_signal(stop):
        with stop._cond:  # what Event.wait holds between its waits
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))  # the handler runs at one of these bytecodes
        assert stop.wait(5)
    print("stopped", flush=True)
    """
)


@pytest.mark.integration
def test_a_signal_that_lands_inside_the_events_wait_still_stops_the_reader() -> None:
    """A metrics collector hung this way under load, its SIGTERM never acted on (1 in 150 stops of a
    tight wait loop)."""
    proc = subprocess.run([sys.executable, "-c", INSIDE_WAIT], capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (0, "stopped\n"), proc.stderr


def test_without_a_signal_the_previous_handlers_are_back() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop = threading.Event()
    with stop_on_signal(stop):
        assert signal.getsignal(signal.SIGTERM) not in (before[signal.SIGTERM], signal.SIG_IGN)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert not stop.is_set()
