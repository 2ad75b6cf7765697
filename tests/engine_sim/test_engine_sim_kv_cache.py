"""The paged prefix cache: chained hashes, LRU eviction order, the offload tier, no-prefix mode."""

from __future__ import annotations

from agentsweep.engine_sim.kv_cache import KVCache, block_hashes


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
    for h in hashes:
        assert cache.register(h)
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
    cache.register(7)
    cache.register(8)
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
    assert not cache.register(1)
    cache.release([], 2)
    assert cache.lookup([1], 9).gpu_blocks == 0 and cache.cpu_capacity == 0


def test_reset_forgets_unreferenced_blocks():
    cache = KVCache(4, cpu_blocks=4)
    _hold(cache, [1, 2])
    assert cache.allocate(1)
    cache.register(3)
    cache.reset()
    assert cache.refs == {3: 1} and cache.available == 3
