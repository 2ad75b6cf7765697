"""Stop signals in a cell: kept beside the exception the handler raises, so a dropped one still stops."""

from __future__ import annotations

import signal

import pytest
from agentsweep.cell.stop import CellInterrupted, install_signal_handlers, interrupted_by, raise_if_stopped


class _SignalledInDel:
    """Receives a signal where Python cannot propagate an exception: in ``__del__`` (as in an at-fork
    callback while a child starts) the handler's exception is printed as "Exception ignored" and lost."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        signal.raise_signal(self.signum)


def test_a_stop_whose_exception_python_dropped_is_raised_at_the_next_check() -> None:
    restore = install_signal_handlers()
    try:
        raise_if_stopped()  # nothing received: a no-op
        _SignalledInDel(signal.SIGTERM)  # collected at once: the handler runs in __del__, its raise lost
        with pytest.raises(CellInterrupted) as err:
            raise_if_stopped()
        assert err.value.signum == signal.SIGTERM
        assert interrupted_by(str(err.value)) == signal.SIGTERM
        # Once: later signals are ignored so the cleanup can finish.
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        restore()
    raise_if_stopped()  # the handlers restored, the signal forgotten
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_stop_raised_unwinds_as_cell_interrupted() -> None:
    restore = install_signal_handlers()
    try:
        with pytest.raises(CellInterrupted, match="interrupted by SIGHUP"):
            signal.raise_signal(signal.SIGHUP)
    finally:
        restore()
