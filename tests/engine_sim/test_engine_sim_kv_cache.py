"""The paged prefix cache: chained hashes, the radix tree of runs, LRU eviction order, the offload tier,
no-prefix mode."""

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
    node, shared = cache.register(cache.root, hashes)
    assert shared == 0
    cache.release(node, 0)


def _chain(*blocks: int) -> list[int]:
    """Chained hashes of blocks with these (one-token) contents."""
    return block_hashes(list(blocks), 1)


def test_eviction_is_lru_and_tail_first():
    cache = KVCache(4)
    a, b = _chain(1, 2), _chain(3, 4)
    _hold(cache, a)  # request A
    _hold(cache, b)  # request B
    assert cache.evictable_blocks() == [a[1], a[0], b[1], b[0]]  # each request's tail goes first
    assert cache.allocate(1)
    assert a[1] not in cache.ref_counts() and cache.lookup(a, 9).gpu_blocks == 1
    # A hit re-references A's first block; released again it becomes the most recently used.
    hit = cache.lookup(a, 9)
    assert hit.reclaim == 1
    node = cache.acquire(hit)
    assert cache.available == 2  # B's blocks are evictable
    cache.release(node, 0)
    assert cache.evictable_blocks() == [b[1], b[0], a[0]]
    assert cache.allocate(2)
    assert cache.evictable_blocks() == [a[0]]
    assert cache.evicted_blocks == 3


def test_a_hit_on_part_of_a_run_splits_it():
    cache = KVCache(8)
    long = _chain(1, 2, 3, 4)
    _hold(cache, long)
    other = _chain(1, 2, 9)  # shares the first two blocks, then differs
    hit = cache.lookup(other, 9)
    assert (hit.gpu_blocks, hit.reclaim) == (2, 2)
    node = cache.acquire(hit)
    assert cache.ref_counts() == {long[0]: 1, long[1]: 1, long[2]: 0, long[3]: 0}
    assert cache.allocate(1)  # the free pool still has room: nothing evicted
    node, shared = cache.register(node, other[2:])
    assert shared == 0 and cache.ref_counts()[other[2]] == 1
    assert cache.evictable_blocks() == [long[3], long[2]]  # the unshared tail keeps its place
    cache.release(node, 0)
    assert cache.evictable_blocks() == [long[3], long[2], other[2], long[1], long[0]]


def test_blocks_another_request_cached_first_are_shared():
    cache = KVCache(4)
    blocks = _chain(7, 8)
    assert cache.allocate(2)
    first, _ = cache.register(cache.root, blocks)
    assert cache.allocate(2)  # a second request filled the same two blocks concurrently
    second, shared = cache.register(cache.root, blocks)
    assert shared == 2 and second is first
    assert cache.free == 2  # its private copies went back to the pool
    assert cache.ref_counts() == {blocks[0]: 2, blocks[1]: 2}
    assert not cache.allocate(3)  # 7 and 8 are in use
    assert cache.allocate(2)
    assert cache.available == 0 and cache.usage == 1.0


def test_offload_tier_keeps_evicted_blocks_and_counts_bytes():
    cache = KVCache(2, cpu_blocks=3, block_bytes=100)
    a = _chain(1, 2, 3)
    _hold(cache, a[:2])
    assert cache.allocate(2)  # evicts the tail, then the head, into the CPU tier
    assert cache.cpu.blocks() == [a[1], a[0]]
    assert cache.bytes_gpu_to_cpu == 200
    hit = cache.lookup(a, 9)
    assert (hit.gpu_blocks, hit.cpu_blocks) == (0, 2)
    cache.release(cache.root, 2)
    assert cache.allocate(2)
    node = cache.load_from_cpu(cache.acquire(hit), a[:2])
    assert cache.bytes_cpu_to_gpu == 200 and not cache.cpu
    assert cache.ref_counts() == {a[0]: 1, a[1]: 1}
    # Lookups continue in the CPU tier after the GPU prefix ends.
    cache.release(node, 0)
    assert cache.allocate(1)  # evicts the tail to the CPU tier
    hit = cache.lookup(a[:2], 9)
    assert (hit.gpu_blocks, hit.cpu_blocks) == (1, 1)
    assert cache.lookup(a[:2], 1).cpu_blocks == 0  # capped


def test_cpu_tier_evicts_lru_when_full():
    cache = KVCache(1, cpu_blocks=2, block_bytes=1)
    blocks = [_chain(h)[0] for h in (1, 2, 3)]
    for h in blocks:
        _hold(cache, [h])
    assert cache.allocate(1)
    assert cache.cpu.blocks() == blocks[1:]


def test_no_prefix_caching_never_hits():
    cache = KVCache(4, cpu_blocks=4, prefix_caching=False)
    assert cache.allocate(2)
    node, shared = cache.register(cache.root, [1])
    assert node is cache.root and shared == 0
    cache.release(node, 2)
    assert cache.lookup([1], 9).gpu_blocks == 0 and cache.cpu_capacity == 0


def test_reset_forgets_unreferenced_blocks():
    cache = KVCache(4, cpu_blocks=4)
    a, b = _chain(1, 2), _chain(3)
    _hold(cache, a)
    assert cache.allocate(1)
    cache.register(cache.root, b)
    cache.reset()
    assert cache.ref_counts() == {b[0]: 1} and cache.available == 3
    assert cache.lookup(a, 9).gpu_blocks == 0


class _PerBlockCache:
    """The cache's rules applied one block at a time: the reference the tree must match."""

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
        victims = []
        for _ in range(n - take):
            h = next(iter(self.evictable))
            del self.evictable[h], self.refs[h]
            victims.append(h)
        if self.cpu_capacity:
            # One eviction enters the CPU tier at once: a victim with a copy there already moves to
            # the end without a new copy, then the oldest go until it fits.
            for h in victims:
                if h in self.cpu:
                    del self.cpu[h]
                else:
                    self.copied += 1
                self.cpu[h] = None
            while len(self.cpu) > self.cpu_capacity:
                del self.cpu[next(iter(self.cpu))]
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

    def register(self, hashes: list[int]) -> int:
        """Cache these filled blocks; a block cached already is shared and its copy freed."""
        shared = 0
        for h in hashes:
            if h in self.refs:
                self.acquire([h])
                self.free += 1
                shared += 1
            else:
                self.refs[h] = 1
                self.cpu.pop(h, None)  # computed again: the GPU copy is the one kept
        return shared

    def release(self, cached: list[int], private: int) -> None:
        for h in reversed(cached):
            self.refs[h] -= 1
            if self.refs[h] == 0:
                self.evictable[h] = None
        self.free += private


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5), st.integers(0, 3), st.integers(1, 12), st.integers(1, 4), st.integers(0, 3)
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(0, 12),
    st.sampled_from([0, 1024]),
)
def test_tree_matches_the_per_block_rules(requests, cpu_blocks, slack):
    """Random requests admitted, filled in chunks and released in turn, some of them concurrently.

    A request is a family (its first block), a branch point (where its chain leaves the family's
    main line), a length, the chunk size it registers its blocks in, and how many of its last blocks
    its lookup may not use (the scheduler always computes the last prompt token): it computes them
    even when cached, and shares them when it registers them.
    """
    tree, ref = KVCache(16, cpu_blocks=cpu_blocks, block_bytes=1), _PerBlockCache(16, cpu_blocks)
    tree.COMPACT_SLACK = slack  # 0: the LRU queue is rebuilt often
    tree.cpu.COMPACT_SLACK = slack
    live: list[tuple[object, list[int], int]] = []  # deepest node, cached blocks, private blocks
    for family, branch, length, chunk, uncapped in requests:
        tokens = [family * 100 + (i if i < branch * 3 else 50 + i) for i in range(length)]
        hashes = block_hashes(tokens, 1)
        cap = max(0, length - uncapped)
        g, c = ref.lookup(hashes, cap)
        hit = tree.lookup(hashes, cap)
        assert (hit.gpu_blocks, hit.cpu_blocks) == (g, c)
        if len(live) > 2:
            node, cached, private = live.pop(0)
            tree.release(node, private)
            ref.release(cached, private)
        reclaim = sum(1 for h in hashes[:g] if ref.refs[h] == 0)
        hit = tree.lookup(hashes, cap)  # the release may have changed the tree
        assert hit.reclaim == reclaim
        need = length - g
        if need > ref.free + len(ref.evictable) - reclaim:
            continue
        ref.acquire(hashes[:g])
        node = tree.acquire(hit)
        assert tree.allocate(need) == ref.allocate(need)
        ref.load_from_cpu(hashes[g : g + c])
        node = tree.load_from_cpu(node, hashes[g : g + c])
        end = max(g + c, length - chunk % 2)  # odd chunks keep the last block private (a partial tail)
        for start in range(g + c, end, chunk):
            part = hashes[start : min(start + chunk, end)]
            want = ref.register(part)
            node, shared = tree.register(node, part)
            assert shared == want
        live.append((node, hashes[:end], length - end))
        assert tree.ref_counts() == ref.refs
        assert tree.evictable_blocks() == list(ref.evictable)
        assert tree.evictable == len(ref.evictable)
        assert tree.cpu.blocks() == list(ref.cpu)
        assert tree.free == ref.free and tree.bytes_gpu_to_cpu == ref.copied
