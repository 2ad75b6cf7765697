"""Virtual time: an asyncio event loop whose clock moves only when every task waits.

``VirtualTimeLoop`` is the standard selector loop with two changes: ``time()`` reads a counter, and
where the loop would block until its next timer, the counter jumps to that timer instead. So
``asyncio.sleep``, ``call_later`` and timeouts all run on the virtual clock, and work the CPU does
takes no virtual time at all. Code written for the wall clock (the replayer's lanes, the simulated
engine's scheduler) runs unchanged on it, as long as it reads time from the loop.

The loop still watches real file descriptors (its self-pipe, so another thread can wake it); it
never waits on them while a timer is pending, and waits at most ``STALL_S`` of real time when none
is: nothing can then move the run on, which is a bug worth one clear line, not a hang.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import selectors
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agentsweep.engine_sim.scheduler import SimClock

T = TypeVar("T")
STALL_S = 60.0  # real seconds the loop waits with no timer pending before it calls the run stuck


class VirtualTimeStalled(RuntimeError):
    """Every task waits on something no timer or thread will ever bring."""


class _JumpSelector(selectors.DefaultSelector):
    """A selector that, asked to wait for ``timeout`` seconds, moves the virtual clock instead."""

    def __init__(self, stall_s: float) -> None:
        super().__init__()
        self.now = 0.0
        self.stall_s = stall_s

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer at all: only another thread can move the run on
            events = super().select(self.stall_s)
            if not events:
                raise VirtualTimeStalled(
                    f"virtual time: every task waits, no timer is pending and nothing arrived for "
                    f"{self.stall_s:g} s: the run cannot move on"
                )
            return events
        events = super().select(0)
        if not events and timeout > 0:
            self.now += timeout
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (see the module's docstring); ``time()`` starts at 0."""

    def __init__(self, stall_s: float = STALL_S) -> None:
        self._jump = _JumpSelector(stall_s)
        super().__init__(self._jump)
        # The Unix time virtual time 0 stands for: this whole second, so that readings taken at whole
        # fractions of a second and dated to the millisecond (server_metrics.csv, power.csv) lose
        # nothing to rounding, and a run's figures do not depend on the fraction it started at.
        self.origin_unix = float(math.floor(time.time()))

    def time(self) -> float:
        return self._jump.now

    def quiet_until(self) -> float:
        """The loop time before which no callback other than the running one can run: now when one
        is ready, else the first pending timer's time (infinity when none is pending)."""
        if self._ready:  # type: ignore[attr-defined]
            return self._jump.now
        scheduled = self._scheduled  # type: ignore[attr-defined]
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
            heapq.heappop(scheduled)._scheduled = False
        return scheduled[0]._when if scheduled else math.inf

    def unix(self) -> float:
        """The Unix time of the virtual clock's reading (a run's files are dated with it)."""
        return self.origin_unix + self._jump.now


def run_virtual(main: Callable[[VirtualTimeLoop], Coroutine[Any, Any, T]]) -> T:
    """Run ``main(loop)`` to its end on a new virtual-time loop, then close the loop."""
    loop = VirtualTimeLoop()
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        return runner.run(main(loop))


class LoopClock(SimClock):
    """The simulated engine's clock on an event loop's time: simulated seconds = loop seconds x speed.

    On a ``VirtualTimeLoop`` the engine never falls behind it, as the wall clock's ``SimClock`` can,
    so every step takes exactly its modelled time whatever the machine's load.
    """

    def __init__(self, loop: VirtualTimeLoop, speed: float) -> None:
        super().__init__(speed)
        self._loop = loop
        self._t0 = loop.time()
        self.start_unix = loop.unix()

    def now(self) -> float:
        return (self._loop.time() - self._t0) * self.speed

    def horizon(self) -> float:
        """Nothing reaches the engine before the loop's next timer: the steps due before it can be
        applied together (with the same figures as one by one, in far fewer loop turns)."""
        return (self._loop.quiet_until() - self._t0) * self.speed
