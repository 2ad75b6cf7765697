"""Paged KV cache: a radix tree of block runs with LRU eviction and an optional CPU offload tier.

Blocks hold ``block_size`` tokens. A full prompt block is identified by a hash chained over its
parent block's hash and its token ids (as vLLM's prefix cache keeps it), so two prompts share a
block only when they share every token before and in it. Accounting is by block counts: the engine
never needs the physical block numbers.

The cached GPU blocks form a tree, as SGLang's radix cache keeps them: a node is a run of blocks
that continue one another, with one reference count for the whole run, and its children continue
it in different ways (keyed by their first block). A request holds a path from the root, so every
operation costs per node, not per block: an agentic session's prompt is a single run that grows
turn by turn, and a 20k-token prompt is one node, not 1,250 dictionary entries. Because the hashes
are chained, two runs that agree on a block agree on every block before it, so matching a run
against a prompt compares its last block (or bisects).

GPU pool: ``total`` blocks = free (no content) + cached-unreferenced (evictable, in LRU order) +
in use (cached runs a running request holds, or private blocks: a partial tail, generated tokens).
A block that another request cached first is shared on registration and the private copy freed,
as SGLang's radix cache does when it inserts a prefix it already holds.

Eviction order is vLLM's (``radix_cache.py`` keeps SGLang's; the dialect picks one): a request's
blocks become evictable tail first when it finishes, and the least recently released go first. A run
is never evicted before the runs that continue it, so the cached blocks always form whole prefixes.

Offload tier (exclusive, a victim cache of runs, ``cpu_tier.py``): a cached block evicted from the
GPU is copied to the CPU tier (GPU->CPU bytes counted); a lookup that misses on the GPU continues in
the CPU tier, and such a hit moves the block back (CPU->GPU bytes counted, transfer time charged by
the scheduler). A block a request computes again on the GPU leaves the CPU tier. The CPU tier
evicts LRU when full.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import accumulate

import numpy as np

from agentsweep.engine_sim.cpu_tier import CpuTier, matched

# Per-token mixing before the blocks are fingerprinted (splitmix64's finalizer constants).
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SHIFT1, _SHIFT2 = np.uint64(30), np.uint64(27)
_POSITION_BASE = 0x9E3779B97F4A7C15


@cache
def _weights(block_size: int) -> np.ndarray:
    """The fingerprint's weight for each position in a block."""
    return np.array([pow(_POSITION_BASE, i + 1, 1 << 64) for i in range(block_size)], dtype=np.uint64)


def block_hashes(tokens: Sequence[int] | np.ndarray, block_size: int, parent: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (token ids, each below 2**64).

    ``parent`` is the hash of the block before ``tokens[0]`` (0: ``tokens`` starts the prompt).
    Each block's ids are mixed and fingerprinted in array operations, then chained in order:
    hash((parent hash, fingerprint)), so a block's hash stands for every token up to its end.
    """
    k = len(tokens) // block_size
    if not k:
        return []
    ids = np.asarray(tokens[: k * block_size], dtype=np.uint64).reshape(k, block_size)
    z = ids * _MIX1
    z ^= z >> _SHIFT1
    z *= _MIX2
    z ^= z >> _SHIFT2
    fingerprints = (z * _weights(block_size)).sum(axis=1, dtype=np.uint64)
    return list(accumulate(fingerprints.tolist(), _chain, initial=parent))[1:]


def _chain(parent: int, fingerprint: int) -> int:
    return hash((parent, fingerprint))


class Node:
    """A run of cached GPU blocks: ``hashes`` continue the parent's run, all with the same references."""

    __slots__ = ("children", "hashes", "key", "parent", "ref", "stamp")

    def __init__(self, hashes: list[int], parent: Node | None, ref: int = 0) -> None:
        self.key = hashes[0] if hashes else 0  # the first block: this node's key among its siblings
        self.hashes = hashes
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.ref = ref  # running requests holding this run
        self.stamp = 0  # its entry in the LRU queue while evictable (0: not queued)


@dataclass(slots=True)
class Lookup:
    gpu_blocks: int  # leading blocks resident on the GPU
    cpu_blocks: int  # following blocks found in the CPU tier
    reclaim: int = 0  # of the GPU hits, blocks no request holds (a hit takes them off the LRU list)
    path: list[tuple[Node, int]] = field(default_factory=list)  # nodes matched, blocks matched in each
    host: list[tuple[Node, int]] = field(default_factory=list)  # host-only nodes matched (radix_cache.py)


class KVCache:
    """Block accounting for one engine (see the module docstring)."""

    COMPACT_SLACK = 1024  # stale LRU queue entries tolerated beyond one per evictable run
    # vLLM caches a chunk's full blocks when its step is scheduled (allocate_slots): a request admitted
    # later in the same step hits them.
    caches_when_scheduled = True
    # vLLM caches every full block of a request, generated tokens' too.
    caches_output_blocks = True

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
        self.root = Node([], None, ref=1)
        # Evictable runs, least recently released first, as (node, stamp): an entry is stale once
        # its node is held again or gone (the node's stamp changed), and is skipped when reached.
        self._queue: deque[tuple[Node, int]] = deque()
        self._queued_live = 0
        self._stamps = 0
        self.evictable = 0  # blocks cached on the GPU that no request holds
        self.cpu = CpuTier(self.cpu_capacity)
        self.evicted_blocks = 0
        self.bytes_gpu_to_cpu = 0
        self.bytes_cpu_to_gpu = 0

    # -- state ---------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Blocks an allocation may take (free + evictable)."""
        return self.free + self.evictable

    @property
    def used(self) -> int:
        return self.total - self.available

    @property
    def usage(self) -> float:
        return self.used / self.total

    @property
    def cpu_used(self) -> int:
        return len(self.cpu)

    def _nodes(self) -> Iterator[Node]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def ref_counts(self) -> dict[int, int]:
        """Cached GPU block -> requests holding it (0: evictable)."""
        return {h: node.ref for node in self._nodes() for h in node.hashes}

    def evictable_blocks(self) -> list[int]:
        """The evictable blocks in the order they would be evicted."""
        out: list[int] = []
        for node, stamp in self._queue:
            if node.stamp == stamp:
                out.extend(reversed(node.hashes))
        return out

    # -- lookups -------------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[int], max_blocks: int) -> Lookup:
        """Longest prefix of ``hashes[:max_blocks]`` on the GPU, then continued in the CPU tier."""
        if not self.prefix_caching:
            return Lookup(0, 0)
        n = min(len(hashes), max_blocks)
        path, g = self._walk(self.root, hashes, n)
        reclaim = sum(m for node, m in path if not node.ref)
        c = 0
        if self.cpu and g < n:
            c = self.cpu.match(hashes, g, n - g)
        return Lookup(g, c, reclaim, path)

    # -- allocation ----------------------------------------------------------------------------
    def acquire(self, hit: Lookup) -> Node:
        """Hold the GPU blocks of a lookup (they leave the evictable list); returns the deepest node."""
        return self._hold_path(self.root, hit.path)

    def allocate(self, n: int) -> bool:
        """Take ``n`` blocks for new content, evicting LRU cached blocks as needed."""
        if n <= 0:
            return True
        if n > self.free + self.evictable:
            return False
        take = min(n, self.free)
        self.free -= take
        n -= take
        if n:
            self.evicted_blocks += n
            self._evict(n)
        return True

    def load_from_cpu(self, node: Node, hashes: Sequence[int]) -> Node:
        """Blocks hit in the CPU tier move to the GPU (already allocated) and are held after ``node``."""
        self.cpu.remove_prefix(hashes)
        self.bytes_cpu_to_gpu += len(hashes) * self.block_bytes
        node, shared = self.register(node, hashes)
        assert not shared, "a CPU-tier hit was also cached on the GPU"
        return node

    def register(self, node: Node, hashes: Sequence[int]) -> tuple[Node, int]:
        """Private blocks just filled with these contents, continuing ``node`` (held): cache them.

        Returns the new deepest held node and how many of the blocks were cached already (another
        request filled them first): those are shared instead and their private copies freed.
        """
        if not self.prefix_caching or not hashes:
            return node, 0
        n = len(hashes)
        path, shared = self._walk(node, hashes, n)
        node = self._hold_path(node, path)
        if shared < n:
            rest = list(hashes[shared:]) if shared else list(hashes)
            if self.cpu:
                self.cpu.remove_prefix(rest)  # computed again: the GPU copy is the one kept
            if node.ref == 1 and not node.children and node is not self.root:
                node.hashes.extend(rest)  # the run only this request holds grows in place
            else:
                child = Node(rest, node, ref=1)
                node.children[child.key] = child
                node = child
        self.free += shared
        return node, shared

    def release(self, node: Node, private: int, finished: bool = True) -> None:
        """A request lets go of the path ending at ``node`` and of ``private`` blocks.

        ``finished``: False for a preempted request (the same here; SGLang's policy tells them apart).
        The runs no other request holds become evictable tail first (vLLM frees a request's blocks
        in reverse order), so under pressure the end of a long prefix goes before its beginning.
        """
        root = self.root
        while node is not root:
            node.ref -= 1
            if not node.ref:
                self._stamps += 1
                node.stamp = self._stamps
                self._queue.append((node, self._stamps))
                self._queued_live += 1
                self.evictable += len(node.hashes)
            node = node.parent  # type: ignore[assignment]
        self.free += private
        if len(self._queue) > 2 * self._queued_live + self.COMPACT_SLACK:
            self._queue = deque(e for e in self._queue if e[0].stamp == e[1])

    def reset(self) -> None:
        """Forget every unreferenced cached block (GPU and CPU tier), as /reset_prefix_cache does."""
        for node, stamp in self._queue:
            if node.stamp == stamp:
                node.stamp = 0
                del node.parent.children[node.key]  # type: ignore[union-attr]
                node.hashes = []
        self._queue.clear()
        self._queued_live = 0
        self.free += self.evictable
        self.evictable = 0
        self.cpu.clear()

    # -- internals -----------------------------------------------------------------------------
    @staticmethod
    def _walk(node: Node, hashes: Sequence[int], end: int) -> tuple[list[tuple[Node, int]], int]:
        """The runs below ``node`` that ``hashes[:end]`` continues into (with the blocks matched in
        each; only the last may match in part), and how many blocks they match in all."""
        pos = 0
        path: list[tuple[Node, int]] = []
        while pos < end:
            child = node.children.get(hashes[pos])
            if child is None:
                break
            m = matched(child.hashes, hashes, pos, end - pos)
            path.append((child, m))
            pos += m
            if m < len(child.hashes):
                break
            node = child
        return path, pos

    def _hold_path(self, node: Node, path: list[tuple[Node, int]]) -> Node:
        """Hold the runs of a walk from ``node`` (splitting a run matched in part); returns the deepest."""
        for run, m in path:
            if m < len(run.hashes):
                run = self._split(run, m)
            self._hold(run)
            node = run
        return node

    def _hold(self, node: Node) -> None:
        if not node.ref:
            self.evictable -= len(node.hashes)
            if node.stamp:
                node.stamp = 0
                self._queued_live -= 1
        node.ref += 1

    def _split(self, node: Node, k: int) -> Node:
        """Cut ``node`` after its first ``k`` blocks; returns the new upper node (the caller holds it).

        The lower part stays the same object, so requests holding it and its LRU entry stay valid.
        """
        hs = node.hashes
        parent = node.parent
        assert parent is not None
        upper = Node(hs[:k], parent, ref=node.ref)
        del hs[:k]
        node.key = hs[0]
        node.parent = upper
        upper.children[node.key] = node
        parent.children[upper.key] = upper
        return upper

    def _evict(self, n: int) -> None:
        """Evict ``n`` evictable blocks: the oldest release first, each run from its tail."""
        queue = self._queue
        victims: list[list[int]] | None = [] if self.cpu_capacity else None
        self.evictable -= n
        while n:
            node, stamp = queue[0]
            if node.stamp != stamp:
                queue.popleft()
                continue
            hs = node.hashes
            k = min(n, len(hs))
            if victims is not None:
                victims.append(hs[-k:])
            del hs[-k:]
            n -= k
            if not hs:
                queue.popleft()
                self._queued_live -= 1
                node.stamp = 0
                del node.parent.children[node.key]  # type: ignore[union-attr]
        if victims:
            self._offload(victims)

    def _offload(self, victims: list[list[int]]) -> None:
        """Runs evicted from the GPU, oldest first, enter the CPU tier in that order (LRU)."""
        self.bytes_gpu_to_cpu += sum(map(len, victims)) * self.block_bytes
        self.cpu.add(victims)  # takes the lists over
