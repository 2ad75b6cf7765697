"""Theoretical prefix-cache models over hash ids: an infinite cache and a finite two-tier LRU.

A request's hit is the longest prefix of its hash ids already cached in its scope (a block after a
miss is never a hit, as in a real prefix cache). Scopes keep traces apart: use ``Trace.scope_key``,
or ``PlaySynth.cache_scope`` when content is salted per play.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterator, Sequence
from itertools import repeat


def _consume(it: Iterator[object]) -> None:
    deque(it, maxlen=0)


class PrefixTracker:
    """Infinite cache per scope: ``observe(hash_ids, scope) -> hit_blocks``, then remembers the ids."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, set[int]] = {}

    def observe(self, hash_ids: Sequence[int], scope: Hashable = "") -> int:
        seen = self._seen.setdefault(scope, set())
        hits = 0
        for hid in hash_ids:
            if hid not in seen:
                break
            hits += 1
        seen.update(hash_ids)
        return hits

    def peek(self, hash_ids: Sequence[int], scope: Hashable = "") -> int:
        """Hit blocks without recording the request."""
        seen = self._seen.get(scope, ())
        hits = 0
        for hid in hash_ids:
            if hid not in seen:
                break
            hits += 1
        return hits

    def forget(self, scope: Hashable) -> None:
        self._seen.pop(scope, None)


class LRUPrefixCache:
    """A finite cache of ``capacity`` blocks with an optional second tier of ``second_tier`` blocks.

    Blocks evicted from the first tier move to the second (like a CPU offload tier); a second-tier hit
    moves the block back. After a lookup every block of the request is inserted, its prefix last, so
    a request's leading blocks are the most recently used.
    """

    def __init__(self, capacity: int, second_tier: int = 0) -> None:
        if capacity < 0 or second_tier < 0:
            raise ValueError("cache sizes must be >= 0")
        self.capacity = capacity
        self.second_tier = second_tier
        self._t1: OrderedDict[int, None] = OrderedDict()
        self._t2: OrderedDict[int, None] = OrderedDict()
        self._scopes: dict[Hashable, int] = {}  # scope -> key base (ids below 2**48 stay apart)

    def _keys(self, hash_ids: Sequence[int], scope: Hashable) -> list[int]:
        base = self._scopes.get(scope)
        if base is None:
            base = self._scopes[scope] = len(self._scopes) << 48
        return [base | h for h in hash_ids] if base else list(hash_ids)

    def observe(self, hash_ids: Sequence[int], scope: Hashable = "") -> tuple[int, int]:
        """(first-tier hit blocks, second-tier hit blocks) of the prefix, then caches the request."""
        t1, t2 = self._t1, self._t2
        keys = self._keys(hash_ids, scope)
        hit1 = hit2 = 0
        for key in keys:
            if key in t1:
                hit1 += 1
            elif key in t2:
                hit2 += 1
            else:
                break
        if self.capacity == 0:
            return hit1, hit2
        if t2:
            _consume(map(t2.pop, keys, repeat(None)))
        move = t1.move_to_end
        for key in reversed(keys):
            try:
                move(key)
            except KeyError:
                t1[key] = None
        if len(t1) > self.capacity:
            pop = t1.popitem
            for _ in range(len(t1) - self.capacity):
                evicted, _ = pop(last=False)
                if self.second_tier:
                    t2[evicted] = None
            while len(t2) > self.second_tier:
                t2.popitem(last=False)
        return hit1, hit2

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)
