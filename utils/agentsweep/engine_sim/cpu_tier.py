"""The CPU offload tier: runs of blocks evicted from the GPU, kept in LRU order, found by their first block.

An eviction takes the tail of a cached GPU run, so what reaches the CPU tier is a run of blocks that
continue one another (listed root first). The tier keeps each run whole: a map from its first block
finds it, a queue holds the runs oldest first, and every operation costs per run rather than per
block (a 20k-token prompt is 1,250 blocks).

The tier is exclusive: a block lives on the GPU or here, not both. A lookup continues here where the
GPU prefix ends, so the runs it meets start exactly there; a hit takes blocks from the front of a
run (the rest keeps its place in the LRU order), and a full tier drops blocks from the end of the
oldest run: the blocks that entered first, since an eviction sends a run's tail before its head.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


def matched(run: list[int], hashes: Sequence[int], start: int, limit: int) -> int:
    """How many leading blocks of ``run`` equal ``hashes[start:]`` (at most ``limit``; run[0] matches).

    Chained hashes make the answer monotone (a block matches only if every block before it does),
    so it is the last block when the whole run matches, and a bisection otherwise.
    """
    n = min(len(run), limit)
    if run[n - 1] == hashes[start + n - 1]:
        return n
    lo, hi = 1, n - 1  # run[:lo] matches, run[hi] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if run[mid - 1] == hashes[start + mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class CpuTier:
    COMPACT_SLACK = 1024  # emptied runs tolerated in the queue beyond one per live run

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._runs: dict[int, list[int]] = {}  # first block -> its run (root first)
        self._queue: deque[list[int]] = deque()  # runs, oldest first; an emptied run waits to be reached
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def blocks(self) -> list[int]:
        """Every block, in the order the tier would drop them."""
        out: list[int] = []
        for run in self._queue:
            out.extend(reversed(run))
        return out

    def match(self, hashes: Sequence[int], start: int, limit: int) -> int:
        """How many blocks from ``hashes[start]`` on (at most ``limit``) are here, in one chain."""
        p, end = start, start + limit
        while p < end:
            run = self._runs.get(hashes[p])
            if run is None:
                break
            m = matched(run, hashes, p, end - p)
            p += m
            if m < len(run):
                break
        return p - start

    def remove_prefix(self, hashes: Sequence[int]) -> int:
        """Take out the blocks here that ``hashes`` starts with (a hit, or blocks cached on the GPU
        again); returns how many."""
        p, n = 0, len(hashes)
        while p < n:
            run = self._runs.pop(hashes[p], None)
            if run is None:
                break
            m = matched(run, hashes, p, n - p)
            del run[:m]
            p += m
            if run:
                self._runs[run[0]] = run
                break
        self._len -= p
        return p

    def add(self, runs: list[list[int]]) -> None:
        """Runs just evicted from the GPU, oldest first, enter as the newest; the oldest blocks go when full."""
        for run in runs:
            self._runs[run[0]] = run
            self._queue.append(run)
            self._len += len(run)
        over = self._len - self.capacity
        if over > 0:
            self._drop(over)
        if len(self._queue) > 2 * len(self._runs) + self.COMPACT_SLACK:
            self._queue = deque(run for run in self._queue if run)

    def clear(self) -> None:
        self._runs.clear()
        self._queue.clear()
        self._len = 0

    def _drop(self, n: int) -> None:
        self._len -= n
        queue = self._queue
        while n:
            run = queue[0]
            k = min(n, len(run))
            if k == len(run):
                if run:
                    del self._runs[run[0]]
                    run.clear()
                queue.popleft()
            else:
                del run[-k:]
            n -= k
