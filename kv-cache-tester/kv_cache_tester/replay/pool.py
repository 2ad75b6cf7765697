"""Which trace a lane plays next: deterministic for a seed, never one trace live in two lanes."""

from __future__ import annotations

import random
from collections import deque


class TracePool:
    """Hands out trace indices in a seeded shuffled order.

    Without recycle each trace is played once. With recycle a released trace goes to the back of
    the queue, so unused traces always come first, then the least recently finished ones. A trace
    that is live in a lane is skipped until released. ``play`` counts earlier plays of the trace
    (0 for the first), so a replayed trace can get fresh content.
    """

    def __init__(self, indices: list[int], seed: int, recycle: bool) -> None:
        order = list(indices)
        random.Random(f"pool:{seed}").shuffle(order)
        self._queue: deque[int] = deque(order)
        self._live: set[int] = set()
        self._plays: dict[int, int] = {}
        self.recycle = recycle

    def lease(self) -> tuple[int, int] | None:
        for _ in range(len(self._queue)):
            idx = self._queue.popleft()
            if idx in self._live:
                self._queue.append(idx)
                continue
            self._live.add(idx)
            play = self._plays.get(idx, 0)
            self._plays[idx] = play + 1
            return idx, play
        return None

    def release(self, idx: int) -> None:
        self._live.discard(idx)
        if self.recycle:
            self._queue.append(idx)

    @property
    def live(self) -> frozenset[int]:
        return frozenset(self._live)
