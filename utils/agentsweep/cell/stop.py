"""Stop signals in a cell: SIGTERM, SIGINT or SIGHUP unwind the cell as ``CellInterrupted``, which stops
every child and still writes the verdict (``agentsweep.cell.lifecycle.run_cell``).

The handler raises, and Python drops an exception raised where it cannot propagate: a handler that runs
inside an at-fork callback (starting a child with ``preexec_fn``, as every engine and client start does)
or inside a ``__del__`` prints "Exception ignored" and the cell would run on to its end. So the signal
is kept beside the exception, and the cell's waits (``raise_if_stopped``) raise it again should it have
been dropped.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType

from agentsweep.watchdog import STOP_SIGNALS

# How a verdict a stop signal ended begins: "interrupted by SIGTERM".
INTERRUPTED_BY = "interrupted by "

# The stop signal received since the handlers were installed (at most one: later ones are ignored).
_received: list[int] = []


class CellInterrupted(Exception):
    """SIGTERM, SIGINT or SIGHUP reached the cell; unwinding stops every child and still writes the verdict."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"{INTERRUPTED_BY}{signal.Signals(signum).name}")


def interrupted_by(reason: str | None) -> int | None:
    """The signal a verdict's reason says stopped the cell (``CellInterrupted``'s text), else None."""
    if reason is None or not reason.startswith(INTERRUPTED_BY):
        return None
    name = reason.removeprefix(INTERRUPTED_BY).split(maxsplit=1)[0]
    return signal.Signals[name] if name in signal.Signals.__members__ else None


def install_signal_handlers() -> Callable[[], None]:
    """SIGTERM/SIGINT/SIGHUP raise CellInterrupted once; later ones are ignored so cleanup can finish.
    Returns what restores the previous handlers (and forgets the signal)."""
    _received.clear()

    def handler(signum: int, frame: FrameType | None) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        _received.append(signum)
        raise CellInterrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _received.clear()

    return restore


def raise_if_stopped() -> None:
    """Raise CellInterrupted for a stop signal received whose exception Python dropped (a no-op when
    none came: one that was raised has unwound past every caller of this already)."""
    if _received:
        raise CellInterrupted(_received[0])
