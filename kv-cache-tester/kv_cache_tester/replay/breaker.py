"""Circuit breaker: end the run when the server is gone, not on one unlucky request.

Connection-class failures (connect, stream_cut) count up; the first one starts a probe that tries
a plain TCP connect to the server every ``window / threshold`` seconds and counts its failures
too, so a dead server is detected even when every lane is in a long think time. The breaker trips
when ``threshold`` consecutive connection errors span at least ``window`` seconds. Any successful
request or probe resets it. While errors are pending, ``healthy`` is clear: lanes wait on it before
dispatching, so a dead server does not burn through the traces in a burst of instant failures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kv_cache_tester.replay.client import CONNECTION_CLASSES


class CircuitBreaker:
    def __init__(
        self,
        host: str,
        port: int,
        on_trip: Callable[[str], None],
        threshold: int = 5,
        window: float = 3.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.host = host
        self.port = port
        self.threshold = threshold
        self.window = window
        self._on_trip = on_trip
        self._clock = clock
        self.consecutive = 0
        self._first: float | None = None
        self._probe: asyncio.Task[None] | None = None
        self.tripped: str | None = None
        self.healthy = asyncio.Event()
        self.healthy.set()

    def observe(self, error_class: str | None) -> None:
        """Feed every finished request: None for a success, else its error class."""
        if error_class is None:
            self._reset()
        elif error_class in CONNECTION_CLASSES:
            self._count()

    def _reset(self) -> None:
        self.consecutive = 0
        self._first = None
        self.healthy.set()

    def _count(self) -> None:
        if self.tripped:
            return
        now = self._clock()
        if self._first is None:
            self._first = now
        self.consecutive += 1
        self.healthy.clear()
        span = now - self._first
        if self.consecutive >= self.threshold and span >= self.window:
            self.tripped = (
                f"server {self.host}:{self.port} unreachable: {self.consecutive} consecutive "
                f"connection errors over {span:.1f} s (circuit breaker)"
            )
            self.healthy.set()  # release the waiting lanes: the run is stopping
            self._on_trip(self.tripped)
        elif self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._run_probe())

    async def _run_probe(self) -> None:
        interval = max(self.window / self.threshold, 0.05)
        while self._first is not None and not self.tripped:
            await asyncio.sleep(interval)
            if self._first is None or self.tripped:
                return
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), interval)
            except (OSError, TimeoutError):
                self._count()
                continue
            writer.close()
            self._reset()
            return

    def close(self) -> None:
        self.healthy.set()
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
