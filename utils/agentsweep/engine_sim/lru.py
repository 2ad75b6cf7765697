"""An insertion-ordered set of block hashes with bulk operations that run in C, not per block in Python.

The CPU offload tier moves blocks in and out of its LRU list a GPU eviction at a time, thousands of
blocks at once. An OrderedDict costs several hundred nanoseconds per block for that; this keeps the
order as a queue of runs (one list per bulk append) and a map from member to the run it was last
appended in. A key is a member while it maps to its run: removing one only deletes its map entry,
and its stale queue entry is skipped when the queue reaches it. The queue is rebuilt when stale
entries outnumber members, so memory stays proportional to the members.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from itertools import compress, repeat
from operator import is_not, not_


class LruSet:
    COMPACT_SLACK = 4096  # stale queue entries tolerated beyond one per member

    def __init__(self) -> None:
        self._where: dict[int, list[int]] = {}  # member -> its run
        self._runs: deque[list[int]] = deque()
        self._head = 0  # next unread position in _runs[0]
        self._queued = 0  # queue entries from the head on, stale ones included
        self._len = 0
        self.contains = self._where.__contains__  # membership for C-level iteration

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[int]:
        """Members, oldest first."""
        get = self._where.get
        for i, run in enumerate(self._runs):
            for h in run[self._head :] if i == 0 else run:
                if get(h) is run:
                    yield h

    def extend(self, hashes: Iterable[int]) -> None:
        """Append these hashes, none of them a member, as the newest members."""
        run = list(hashes)
        if not run:
            return
        self._where.update(zip(run, repeat(run)))
        self._runs.append(run)
        self._queued += len(run)
        self._len += len(run)
        if self._queued > 2 * self._len + self.COMPACT_SLACK:
            self._compact()

    def discard(self, hashes: Iterable[int]) -> int:
        """Remove these hashes where present; returns how many were members."""
        values = list(map(self._where.pop, hashes, repeat(None)))
        n = len(values) - values.count(None)
        self._len -= n
        return n

    def pop_oldest(self, n: int) -> list[int]:
        """Remove and return the ``n`` oldest members (fewer if there are fewer)."""
        out: list[int] = []
        where = self._where
        runs = self._runs
        while len(out) < n and runs:
            run = runs[0]
            start = self._head
            seg = run[start : start + n - len(out)]
            # Take the run's next keys out of the map; put back the few that are no longer this run's
            # members (taken out since, or appended again to a later run).
            values = list(map(where.pop, seg, repeat(None)))
            stale = list(map(is_not, values, repeat(run)))
            if True in stale:
                where.update(
                    (h, v) for h, v in zip(seg, values, strict=True) if v is not run and v is not None
                )
                out.extend(compress(seg, map(not_, stale)))
            else:
                out.extend(seg)
            self._head = start + len(seg)
            self._queued -= len(seg)
            if self._head >= len(run):
                runs.popleft()
                self._head = 0
        self._len -= len(out)
        return out

    def clear(self) -> None:
        """Remove every member."""
        self._where.clear()
        self._runs.clear()
        self._head = self._queued = self._len = 0

    def _compact(self) -> None:
        run = list(self)
        self._runs.clear()
        self._head = 0
        self._queued = len(run)
        if run:
            self._runs.append(run)
            self._where.update(zip(run, repeat(run)))
