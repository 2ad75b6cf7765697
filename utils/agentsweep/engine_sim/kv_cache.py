"""Paged KV cache with a prefix hash chain, LRU eviction and an optional CPU offload tier.

Blocks hold ``block_size`` tokens. A full prompt block is identified by a hash chained over its
parent block's hash and its token ids (as vLLM's prefix cache keeps it), so two prompts share a
block only when they share every token before and in it. Accounting is by block counts: the engine
never needs the physical block numbers.

GPU pool: ``total`` blocks = free (no content) + cached-unreferenced (evictable, in LRU order) +
in use (referenced by running requests: cached blocks with a reference count, or private blocks
that hold a partial tail, generated tokens, or a duplicate of a block another request cached first).

A request's blocks are freed tail first (vLLM frees a request's blocks in reverse order), so under
pressure the end of a long prefix goes before its beginning.

Offload tier (exclusive, a victim cache): a cached block evicted from the GPU is copied to the CPU
tier (GPU->CPU bytes counted); a lookup that misses on the GPU continues in the CPU tier, and such a
hit moves the block back (CPU->GPU bytes counted, transfer time charged by the scheduler). The CPU
tier evicts LRU when full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, islice, repeat, takewhile
from operator import add, not_, sub

from agentsweep.engine_sim.lru import LruSet, consume


def block_hashes(tokens: Sequence[int], block_size: int, parent: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (ints only, so deterministic across runs).

    ``parent`` is the hash of the block before ``tokens[0]`` (0: ``tokens`` starts the prompt).
    """
    out: list[int] = []
    h = parent
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, *tokens[start : start + block_size]))
        out.append(h)
    return out


@dataclass(slots=True)
class Lookup:
    gpu_blocks: int  # leading blocks resident on the GPU
    cpu_blocks: int  # following blocks found in the CPU tier


class KVCache:
    """Block accounting for one engine. Every operation takes a whole request's blocks at once and
    runs per block in C (map, zip, compress, dict.update): a request touches thousands of blocks,
    and a Python loop per block cost as much as everything else the simulator does.

    ``refs`` maps each cached GPU block to its reference count while running requests use it, and
    to its LRU run while it is evictable (``evictable`` is an ``LruSet`` over the same map): one map
    for both keeps it to one dict access per block and step.
    """

    def __init__(
        self,
        total_blocks: int,
        cpu_blocks: int = 0,
        prefix_caching: bool = True,
        block_bytes: int = 0,
    ) -> None:
        if total_blocks <= 0:
            raise ValueError("the GPU KV pool needs at least one block")
        self.total = total_blocks
        self.free = total_blocks
        self.prefix_caching = prefix_caching
        self.cpu_capacity = cpu_blocks if prefix_caching else 0
        self.block_bytes = block_bytes  # bytes one block moves between GPU and CPU (all ranks)
        self.refs: dict[int, int | list[int]] = {}  # cached block -> reference count, or its LRU run
        self.evictable = LruSet(self.refs)  # blocks no request uses, least recently released first
        # Bumped whenever a hit references a block that a running request already holds. A request
        # whose admission saw the same value at release still holds the blocks it registered alone.
        self.share_epoch = 0
        self.cpu = LruSet()
        self.evicted_blocks = 0
        self.bytes_gpu_to_cpu = 0
        self.bytes_cpu_to_gpu = 0

    # -- state ---------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Blocks an allocation may take (free + evictable)."""
        return self.free + len(self.evictable)

    @property
    def used(self) -> int:
        return self.total - self.available

    @property
    def usage(self) -> float:
        return self.used / self.total

    @property
    def cpu_used(self) -> int:
        return len(self.cpu)

    def ref_counts(self) -> dict[int, int]:
        """Cached block -> references (0: evictable)."""
        return {h: r if r.__class__ is int else 0 for h, r in self.refs.items()}  # type: ignore[misc]

    # -- lookups -------------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[int], max_blocks: int) -> Lookup:
        """Longest prefix of ``hashes[:max_blocks]`` on the GPU, then continued in the CPU tier."""
        if not self.prefix_caching:
            return Lookup(0, 0)
        n = min(len(hashes), max_blocks)
        g = len(list(takewhile(self.refs.__contains__, islice(hashes, n))))
        c = 0
        if self.cpu and g < n:
            c = len(list(takewhile(self.cpu.contains, islice(hashes, g, n))))
        return Lookup(g, c)

    def pinned_by(self, hashes: Sequence[int]) -> int:
        """How many of these cached blocks are evictable now (a hit on them takes them off the list)."""
        return list(map(type, map(self.refs.__getitem__, hashes))).count(list)

    # -- allocation ----------------------------------------------------------------------------
    def acquire(self, hashes: Sequence[int]) -> None:
        """Reference GPU-resident cached blocks (a hit): they leave the evictable list."""
        refs = self.refs
        counts = list(map(refs.__getitem__, hashes))
        pinned = list(map(type, counts)).count(list)
        if pinned < len(counts):
            self.share_epoch += 1  # a block some running request holds is now shared
        if pinned:
            self.evictable.forgotten(pinned)  # their runs are overwritten by counts just below
            refs.update(zip(hashes, [r + 1 if r.__class__ is int else 1 for r in counts], strict=True))  # type: ignore[operator]
        else:
            refs.update(zip(hashes, map(add, counts, repeat(1)), strict=True))

    def allocate(self, n: int) -> bool:
        """Take ``n`` blocks for new content, evicting LRU cached blocks as needed."""
        if n <= 0:
            return True
        if n > self.free + len(self.evictable):
            return False
        take = min(n, self.free)
        self.free -= take
        n -= take
        if n:
            victims = self.evictable.pop_oldest(n)
            self.evicted_blocks += n
            self._offload(victims)
        return True

    def load_from_cpu(self, hashes: Sequence[int]) -> None:
        """Blocks hit in the CPU tier move to the GPU (already allocated) and are referenced."""
        self.cpu.discard(hashes)
        self.refs.update(zip(hashes, repeat(1)))
        self.bytes_cpu_to_gpu += len(hashes) * self.block_bytes

    def register(self, hashes: Sequence[int]) -> list[int]:
        """Private blocks just filled with these contents: cache those not cached yet (returned)."""
        if not self.prefix_caching:
            return []
        new = dict.fromkeys(hashes, 1)
        refs = self.refs
        cached = new.keys() & refs.keys()  # filled by another request first: stays private
        if cached:
            consume(map(new.__delitem__, cached))
        refs.update(new)
        return list(new)

    def release(self, cached: Sequence[int], private: int, exclusive_from: int | None = None) -> None:
        """A request lets go of its blocks: cached ones in reverse order (tail evicted first).

        ``cached[exclusive_from:]`` are known to be held by this request alone (see ``share_epoch``):
        they become evictable without reading their reference counts.
        """
        refs = self.refs
        k = len(cached) if exclusive_from is None else exclusive_from
        own = list(cached[k:])[::-1]
        shared = list(cached[:k])[::-1]
        counts: list[int] = list(map(sub, map(refs.__getitem__, shared), repeat(1)))  # type: ignore[arg-type]
        zeros = counts.count(0)
        if zeros < len(shared):  # still used by other requests: the new counts
            refs.update(compress(zip(shared, counts, strict=True), counts))
        if zeros == len(shared):
            self.evictable.extend(own + shared)
        else:
            self.evictable.extend(own + list(compress(shared, map(not_, counts))))
        self.free += private

    def reset(self) -> None:
        """Forget every unreferenced cached block (GPU and CPU tier), as /reset_prefix_cache does."""
        self.free += len(self.evictable)
        self.evictable.clear()
        self.cpu.clear()

    def _offload(self, victims: list[int]) -> None:
        """Blocks evicted from the GPU, oldest first, enter the CPU tier in that order (LRU)."""
        if not self.cpu_capacity:
            return
        cpu = self.cpu
        copied = len(victims) - cpu.discard(victims)  # already there: moves to the end, no copy
        cpu.extend(victims)
        self.bytes_gpu_to_cpu += copied * self.block_bytes
        over = len(cpu) - self.cpu_capacity
        if over > 0:
            cpu.pop_oldest(over)
