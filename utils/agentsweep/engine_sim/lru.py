"""An insertion-ordered set of block hashes with bulk operations that run in C, not per block in Python.

The KV cache moves blocks in and out of its LRU lists a whole request at a time (a release adds a
request's blocks, an eviction takes the oldest n), thousands of blocks per request. An OrderedDict
costs several hundred nanoseconds per block for that; this keeps the order as a queue of runs (one
list per bulk append) and a map from member to the run it was last appended in. Removing a member
only drops it from the map; its stale queue entry is skipped when the queue reaches it (it no longer
maps to that run). The queue is rebuilt when stale entries outnumber members, so memory stays
proportional to the members.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import compress, repeat
from operator import is_


def consume(it: Iterable[object]) -> None:
    """Run an iterator to its end in C."""
    deque(it, maxlen=0)


class LruSet:
    COMPACT_SLACK = 4096  # stale queue entries tolerated beyond one per member

    def __init__(self) -> None:
        self._where: dict[int, list[int]] = {}  # member -> the run it was last appended in
        self._runs: deque[list[int]] = deque()
        self._head = 0  # next unread position in _runs[0]
        self._queued = 0  # queue entries from the head on, stale ones included
        self.contains = self._where.__contains__  # fast membership test for C-level iteration

    def __len__(self) -> int:
        return len(self._where)

    def __bool__(self) -> bool:
        return bool(self._where)

    def __contains__(self, h: int) -> bool:
        return h in self._where

    def __iter__(self) -> Iterator[int]:
        """Members, oldest first."""
        where = self._where
        for i, run in enumerate(self._runs):
            for h in run[self._head :] if i == 0 else run:
                if where.get(h) is run:
                    yield h

    def extend(self, hashes: Iterable[int]) -> None:
        """Append these (distinct) hashes as the newest members; members among them move to the end."""
        run = list(hashes)
        if not run:
            return
        self._where.update(zip(run, repeat(run)))
        self._runs.append(run)
        self._queued += len(run)
        if self._queued > 2 * len(self._where) + self.COMPACT_SLACK:
            self._compact()

    def discard(self, hashes: Iterable[int]) -> int:
        """Remove these hashes where present; returns how many were members."""
        before = len(self._where)
        consume(map(self._where.pop, hashes, repeat(None)))
        return before - len(self._where)

    def pop_oldest(self, n: int) -> list[int]:
        """Remove and return the ``n`` oldest members (fewer if there are fewer)."""
        out: list[int] = []
        where = self._where
        get = where.get
        runs = self._runs
        while len(out) < n and runs:
            run = runs[0]
            start = self._head
            seg = run[start : start + n - len(out)]
            out.extend(compress(seg, map(is_, map(get, seg), repeat(run))))
            self._head = start + len(seg)
            self._queued -= len(seg)
            if self._head >= len(run):
                runs.popleft()
                self._head = 0
        consume(map(where.__delitem__, out))
        return out

    def clear(self) -> None:
        self._where.clear()
        self._runs.clear()
        self._head = self._queued = 0

    def _compact(self) -> None:
        run = list(self)
        self._runs.clear()
        self._head = 0
        self._queued = 0
        self._where.clear()
        if run:
            self._where.update(zip(run, repeat(run)))
            self._runs.append(run)
            self._queued = len(run)
