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

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (ints only, so deterministic across runs)."""
    out: list[int] = []
    h = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, *tokens[start : start + block_size]))
        out.append(h)
    return out


@dataclass(slots=True)
class Lookup:
    gpu_blocks: int  # leading blocks resident on the GPU
    cpu_blocks: int  # following blocks found in the CPU tier


class KVCache:
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
        self.refs: dict[int, int] = {}  # cached block hash -> references by running requests
        self.evictable: OrderedDict[int, None] = OrderedDict()  # refs == 0, oldest first
        self.cpu: OrderedDict[int, None] = OrderedDict()
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

    # -- lookups -------------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[int], max_blocks: int) -> Lookup:
        """Longest prefix of ``hashes[:max_blocks]`` on the GPU, then continued in the CPU tier."""
        if not self.prefix_caching:
            return Lookup(0, 0)
        refs = self.refs
        n = min(len(hashes), max_blocks)
        g = 0
        while g < n and hashes[g] in refs:
            g += 1
        c = 0
        if self.cpu:
            cpu = self.cpu
            while g + c < n and hashes[g + c] in cpu:
                c += 1
        return Lookup(g, c)

    # -- allocation ----------------------------------------------------------------------------
    def acquire(self, hashes: Sequence[int]) -> None:
        """Reference GPU-resident cached blocks (a hit): they leave the evictable list."""
        refs = self.refs
        evictable = self.evictable
        for h in hashes:
            r = refs[h]
            if r == 0:
                del evictable[h]
            refs[h] = r + 1

    def allocate(self, n: int) -> bool:
        """Take ``n`` blocks for new content, evicting LRU cached blocks as needed."""
        if n <= 0:
            return True
        if n > self.free + len(self.evictable):
            return False
        take = min(n, self.free)
        self.free -= take
        n -= take
        while n:
            h, _ = self.evictable.popitem(last=False)
            del self.refs[h]
            self.evicted_blocks += 1
            self._offload(h)
            n -= 1
        return True

    def load_from_cpu(self, hashes: Sequence[int]) -> None:
        """Blocks hit in the CPU tier move to the GPU (already allocated) and are referenced."""
        for h in hashes:
            self.cpu.pop(h, None)
            self.refs[h] = 1
        self.bytes_cpu_to_gpu += len(hashes) * self.block_bytes

    def register(self, h: int) -> bool:
        """A private block just filled with the content ``h``: cache it (False if already cached)."""
        if not self.prefix_caching or h in self.refs:
            return False
        self.refs[h] = 1
        return True

    def release(self, cached: Sequence[int], private: int) -> None:
        """A request lets go of its blocks: cached ones in reverse order (tail evicted first)."""
        refs = self.refs
        evictable = self.evictable
        for h in reversed(cached):
            r = refs[h] - 1
            refs[h] = r
            if r == 0:
                evictable[h] = None
        self.free += private

    def reset(self) -> None:
        """Forget every unreferenced cached block (GPU and CPU tier), as /reset_prefix_cache does."""
        for h in self.evictable:
            del self.refs[h]
        self.free += len(self.evictable)
        self.evictable.clear()
        self.cpu.clear()

    def _offload(self, h: int) -> None:
        if not self.cpu_capacity:
            return
        cpu = self.cpu
        if h in cpu:
            cpu.move_to_end(h)
            return
        if len(cpu) >= self.cpu_capacity:
            cpu.popitem(last=False)
        cpu[h] = None
        self.bytes_gpu_to_cpu += self.block_bytes
