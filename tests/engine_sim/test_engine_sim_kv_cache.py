"""The paged prefix cache: chained hashes, LRU eviction order, the offload tier, no-prefix mode."""

from __future__ import annotations

from agentsweep.engine_sim.kv_cache import KVCache, block_hashes
from hypothesis import given, settings
from hypothesis import strategies as st


def test_block_hashes_chain_over_prefix():
    a = block_hashes(list(range(40)), 16)
    b = block_hashes([*range(16), 99, *range(17, 40)], 16)
    assert len(a) == 2  # 40 tokens: two whole blocks, the tail is not hashed
    assert a[0] == b[0] and a[1] != b[1]
    # Same block content after a different first block: a different hash (it is a chain).
    c = block_hashes([*range(100, 116), *range(16, 32)], 16)
    assert c[1] != a[1]
    assert block_hashes(list(range(40)), 16) == a  # deterministic


def _hold(cache: KVCache, hashes: list[int]) -> None:
    """Fill fresh blocks with ``hashes`` as a request would, then let them go."""
    assert cache.allocate(len(hashes))
    assert cache.register(hashes) == hashes
    cache.release(hashes, 0)


def test_eviction_is_lru_and_tail_first():
    cache = KVCache(4)
    _hold(cache, [1, 2])  # request A: blocks 1, 2
    _hold(cache, [3, 4])  # request B
    assert list(cache.evictable) == [2, 1, 4, 3]  # each request's tail goes first
    assert cache.allocate(1)
    assert 2 not in cache.refs and cache.lookup([1, 2], 9).gpu_blocks == 1
    # A hit re-references block 1; released again it becomes the most recently used.
    cache.acquire([1])
    assert cache.available == 2  # 4 and 3 evictable
    cache.release([1], 0)
    assert list(cache.evictable) == [4, 3, 1]
    assert cache.allocate(2)
    assert list(cache.evictable) == [1]
    assert cache.evicted_blocks == 3


def test_referenced_blocks_are_never_evicted():
    cache = KVCache(3)
    assert cache.allocate(2)
    assert cache.register([7, 8]) == [7, 8]
    assert cache.register([7]) == []  # already cached
    assert not cache.allocate(2)  # only one free block; 7 and 8 are in use
    assert cache.allocate(1)
    assert cache.available == 0 and cache.usage == 1.0


def test_offload_tier_keeps_evicted_blocks_and_counts_bytes():
    cache = KVCache(2, cpu_blocks=3, block_bytes=100)
    _hold(cache, [1, 2])
    assert cache.allocate(2)  # evicts 2 then 1 into the CPU tier
    assert list(cache.cpu) == [2, 1]
    assert cache.bytes_gpu_to_cpu == 200
    hit = cache.lookup([1, 2, 3], 9)
    assert (hit.gpu_blocks, hit.cpu_blocks) == (0, 2)
    cache.release([], 2)
    assert cache.allocate(2)
    cache.load_from_cpu([1, 2])
    assert cache.bytes_cpu_to_gpu == 200 and not cache.cpu and cache.refs == {1: 1, 2: 1}
    # Lookups continue in the CPU tier after the GPU prefix ends.
    cache.release([1, 2], 0)
    assert cache.allocate(1)  # evicts 2 (the tail) to the CPU tier
    hit = cache.lookup([1, 2], 9)
    assert (hit.gpu_blocks, hit.cpu_blocks) == (1, 1)
    assert cache.lookup([1, 2], 1).cpu_blocks == 0  # capped


def test_cpu_tier_evicts_lru_when_full():
    cache = KVCache(1, cpu_blocks=2, block_bytes=1)
    for h in (1, 2, 3):
        _hold(cache, [h])
    assert cache.allocate(1)
    assert list(cache.cpu) == [2, 3]


def test_no_prefix_caching_never_hits():
    cache = KVCache(4, cpu_blocks=4, prefix_caching=False)
    assert cache.allocate(2)
    assert cache.register([1]) == []
    cache.release([], 2)
    assert cache.lookup([1], 9).gpu_blocks == 0 and cache.cpu_capacity == 0


def test_reset_forgets_unreferenced_blocks():
    cache = KVCache(4, cpu_blocks=4)
    _hold(cache, [1, 2])
    assert cache.allocate(1)
    cache.register([3])
    cache.reset()
    assert cache.refs == {3: 1} and cache.available == 3


class _PerBlockCache:
    """The cache's rules applied one block at a time: the reference the bulk operations must match."""

    def __init__(self, total: int, cpu_blocks: int) -> None:
        self.free, self.cpu_capacity = total, cpu_blocks
        self.refs: dict[int, int] = {}
        self.evictable: dict[int, None] = {}
        self.cpu: dict[int, None] = {}
        self.copied = 0

    def lookup(self, hashes: list[int], cap: int) -> tuple[int, int]:
        g = 0
        while g < min(len(hashes), cap) and hashes[g] in self.refs:
            g += 1
        c = 0
        while g + c < min(len(hashes), cap) and hashes[g + c] in self.cpu:
            c += 1
        return g, c

    def allocate(self, n: int) -> bool:
        if n > self.free + len(self.evictable):
            return False
        take = min(n, self.free)
        self.free -= take
        for _ in range(n - take):
            h = next(iter(self.evictable))
            del self.evictable[h], self.refs[h]
            if self.cpu_capacity:
                if h in self.cpu:
                    del self.cpu[h]
                else:
                    self.copied += 1
                    if len(self.cpu) >= self.cpu_capacity:
                        del self.cpu[next(iter(self.cpu))]
                self.cpu[h] = None
        return True

    def acquire(self, hashes: list[int]) -> None:
        for h in hashes:
            if self.refs[h] == 0:
                del self.evictable[h]
            self.refs[h] += 1

    def load_from_cpu(self, hashes: list[int]) -> None:
        for h in hashes:
            self.cpu.pop(h, None)
            self.refs[h] = 1

    def register(self, hashes: list[int]) -> list[int]:
        new = []
        for h in hashes:
            if h not in self.refs:
                self.refs[h] = 1
                new.append(h)
        return new

    def release(self, cached: list[int], private: int) -> None:
        for h in reversed(cached):
            self.refs[h] -= 1
            if self.refs[h] == 0:
                self.evictable[h] = None
        self.free += private


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 12)), min_size=1, max_size=60),
    st.integers(0, 12),
    st.sampled_from([0, 4096]),
)
def test_bulk_operations_match_the_per_block_rules(requests, cpu_blocks, slack):
    """Random requests (a prefix family and a length each) admitted, filled and released in turn."""
    bulk, ref = KVCache(16, cpu_blocks=cpu_blocks, block_bytes=1), _PerBlockCache(16, cpu_blocks)
    bulk.evictable.COMPACT_SLACK = bulk.cpu.COMPACT_SLACK = slack  # 0: the LRU queues are rebuilt often
    live: list[tuple[list[int], int, int, int]] = []  # cached, private, own_from, epoch
    for family, length in requests:
        hashes = block_hashes([family] * (length * 4), 4)
        g, c = ref.lookup(hashes, length)
        hit = bulk.lookup(hashes, length)
        assert (hit.gpu_blocks, hit.cpu_blocks) == (g, c)
        if len(live) > 2:
            cached, private, own_from, epoch = live.pop(0)
            # as the scheduler does: its own blocks are released uncounted unless shared since
            bulk.release(cached, private, own_from if bulk.share_epoch == epoch else None)
            ref.release(cached, private)
        reclaim = sum(1 for h in hashes[:g] if ref.refs[h] == 0)
        assert bulk.pinned_by(hashes[:g]) == reclaim
        need = length - g
        if need > ref.free + len(ref.evictable) - reclaim:
            continue
        ref.acquire(hashes[:g])
        bulk.acquire(hashes[:g])
        epoch = bulk.share_epoch
        assert bulk.allocate(need) == ref.allocate(need)
        ref.load_from_cpu(hashes[g : g + c])
        bulk.load_from_cpu(hashes[g : g + c])
        new = ref.register(hashes[g + c :])
        assert bulk.register(hashes[g + c :]) == new
        live.append((hashes[: g + c] + new, length - g - c - len(new), g + c, epoch))
        assert bulk.ref_counts() == ref.refs
        assert list(bulk.evictable) == list(ref.evictable)
        assert list(bulk.cpu) == list(ref.cpu)
        assert bulk.free == ref.free and bulk.bytes_gpu_to_cpu == ref.copied
