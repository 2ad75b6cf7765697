"""SGLang's cache policy (``--dialect sglang``): whole-leaf LRU eviction by access time, a node per
insertion, HiCache's inclusive host tier and its write policies.

Each scenario is one where vLLM's policy (``KVCache``) ends differently; ``test_vllm_policy_differs``
runs the same sequences on it, so every assertion here would fail under the other policy.
"""

from __future__ import annotations

from agentsweep.engine_sim import cli
from agentsweep.engine_sim.kv_cache import KVCache, Node, block_hashes
from agentsweep.engine_sim.radix_cache import RadixNode, SGLangCache
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import parse_args


def _chain(*blocks: int) -> list[int]:
    return block_hashes(list(blocks), 1)


def _fill(cache: KVCache, hashes: list[int], after: Node | None = None) -> Node:
    """A request fills fresh blocks with ``hashes`` (continuing ``after``, held) and holds them."""
    assert cache.allocate(len(hashes))
    node, shared = cache.register(after or cache.root, hashes)
    assert shared == 0
    return node


def _hold(cache: KVCache, hashes: list[int]) -> None:
    """A request computes ``hashes`` from scratch and finishes."""
    cache.release(_fill(cache, hashes), 0)


def _gpu(cache: KVCache, hashes: list[int]) -> int:
    return cache.lookup(hashes, 99).gpu_blocks


def _load(cache: KVCache, hashes: list[int]) -> Node:
    """A request whose prompt is ``hashes`` takes its hits (loading host hits back) and holds them."""
    hit = cache.lookup(hashes, 99)
    node = cache.acquire(hit)
    assert cache.allocate(hit.cpu_blocks)
    if hit.cpu_blocks:
        g = hit.gpu_blocks
        node = cache.load_from_cpu(node, hashes[g : g + hit.cpu_blocks])
    return node


# Scenarios: each builds a cache of the given class, runs a sequence, and returns what the SGLang
# policy asserts about. test_sglang_* check the SGLang outcome; test_vllm_policy_differs checks that
# vLLM's policy gives a different one.


def _lookup_refreshes(cls: type[KVCache]) -> tuple[int, int]:
    cache = cls(4)
    a, b = _chain(1, 2), _chain(3, 4)
    _hold(cache, a)
    _hold(cache, b)  # released after A
    cache.lookup(a, 99)  # a lookup alone (the request was not admitted) refreshes A
    assert cache.allocate(2)
    return _gpu(cache, a), _gpu(cache, b)


def _whole_leaf(cls: type[KVCache]) -> tuple[int, int]:
    cache = cls(4)
    a = _chain(1, 2, 3, 4)
    _hold(cache, a)
    assert cache.allocate(1)  # one block short: the whole leaf goes
    return _gpu(cache, a), cache.evicted_blocks


def _node_per_insert(cls: type[KVCache]) -> int:
    cache = cls(4)
    a = _chain(1, 2, 3, 4)
    node = _fill(cache, a[:2])  # first chunk (or turn)
    node = _fill(cache, a[2:], node)  # the next one, inserted as a node of its own
    cache.release(node, 0)
    assert cache.allocate(1)
    return _gpu(cache, a)


def _preempted_release(cls: type[KVCache], finished: bool) -> tuple[int, int]:
    cache = cls(4)
    a, b = _chain(1, 2), _chain(3, 4)
    _hold(cache, a)
    _hold(cache, b)
    node = _load(cache, a)  # a request takes A's blocks...
    cache.lookup(b, 99)  # ...then B is matched (refreshed)...
    cache.release(node, 0, finished)  # ...then the request lets go of A
    assert cache.allocate(2)
    return _gpu(cache, a), _gpu(cache, b)


def _write_through(cls: type[KVCache]) -> tuple[int, tuple[int, int], int, int]:
    cache = cls(2, cpu_blocks=4)
    a = _chain(1, 2)
    _hold(cache, a)
    on_insert = cache.cpu_used  # write_through: backed up when inserted
    assert cache.allocate(2)  # another request's blocks: A leaves the GPU, its host copy stays
    cache.release(cache.root, 2)
    hit = cache.lookup(a, 99)
    cache.release(_load(cache, a), 0)  # loaded back: resident again, still backed up
    return on_insert, (hit.gpu_blocks, hit.cpu_blocks), cache.cpu_used, _gpu(cache, a)


def _selective(cls: type[KVCache], finished: bool) -> int:
    if cls is KVCache:
        cache = KVCache(4, cpu_blocks=4)
    else:
        cache = SGLangCache(4, 4, write_policy="write_through_selective")
    a = _chain(1, 2)
    node = _fill(cache, a)  # inserted once: not yet backed up
    assert cache.cpu_used == 0
    cache.release(node, 0, finished)  # a finishing request inserts through it again
    return cache.cpu_used


def _write_back(cls: type[KVCache]) -> tuple[int, int, int]:
    cache = KVCache(2, cpu_blocks=4) if cls is KVCache else SGLangCache(2, 4, write_policy="write_back")
    a = _chain(1, 2)
    _hold(cache, a)
    before = cache.cpu_used  # nothing written until the GPU evicts it
    assert cache.allocate(2)
    cache.release(cache.root, 2)
    evicted = cache.cpu_used
    cache.release(_load(cache, a), 0)
    return before, evicted, cache.cpu_used  # inclusive: the copy outlives the load back


def _host_keeps_resident_copies(cls: type[KVCache]) -> tuple[tuple[int, int], tuple[int, int]]:
    cache = cls(4, cpu_blocks=2)
    a, b = _chain(1, 2), _chain(3, 4)
    _hold(cache, a)  # backed up: the host is full of A's copy, which stays while A is on the GPU
    _hold(cache, b)  # no room on the host for B
    assert cache.allocate(4)  # A becomes host-only, B (not backed up) is dropped
    ha, hb = cache.lookup(a, 99), cache.lookup(b, 99)
    return (ha.gpu_blocks, ha.cpu_blocks), (hb.gpu_blocks, hb.cpu_blocks)


def _host_evicts_lru_host_only_leaves(cls: type[KVCache]) -> tuple[int, int, int]:
    cache = cls(2, cpu_blocks=4)
    a, b, c = _chain(1, 2), _chain(3, 4), _chain(5, 6)
    _hold(cache, a)
    _hold(cache, b)  # A host-only now
    cache.lookup(a, 99)  # A (host-only) refreshed: B's host copy is the older once B is evicted
    _hold(cache, c)  # B host-only; C's backup needs room: the least recently used host-only leaf goes
    return cache.lookup(a, 99).cpu_blocks, cache.lookup(b, 99).cpu_blocks, _gpu(cache, c)


def test_sglang_a_lookup_refreshes_what_it_matches():
    assert _lookup_refreshes(SGLangCache) == (2, 0)  # B, least recently accessed, went whole


def test_sglang_evicts_whole_leaves():
    assert _whole_leaf(SGLangCache) == (0, 4)


def test_sglang_keeps_a_node_per_insertion():
    assert _node_per_insert(SGLangCache) == 2  # the later turn's node went, the first stayed


def test_sglang_finishing_refreshes_the_path_and_preemption_does_not():
    assert _preempted_release(SGLangCache, finished=True) == (2, 0)
    assert _preempted_release(SGLangCache, finished=False) == (0, 2)


def test_sglang_write_through_is_inclusive():
    on_insert, hit, after_load, resident = _write_through(SGLangCache)
    assert on_insert == 2 and hit == (0, 2) and after_load == 2 and resident == 2


def test_sglang_write_through_counts_host_bytes_when_written():
    cache = SGLangCache(2, 4, block_bytes=10)
    _hold(cache, _chain(1, 2))
    assert cache.bytes_gpu_to_cpu == 20 and cache.evicted_blocks == 0
    assert cache.allocate(2)
    assert cache.bytes_gpu_to_cpu == 20  # nothing more moves when the GPU evicts a backed-up node
    assert cache.evicted_blocks == 2


def test_sglang_write_through_selective_backs_up_on_the_second_insert():
    assert _selective(SGLangCache, finished=True) == 2
    assert _selective(SGLangCache, finished=False) == 0  # a preempted request inserts nothing


def test_sglang_write_back_writes_on_eviction_and_keeps_the_copy():
    assert _write_back(SGLangCache) == (0, 2, 2)


def test_sglang_host_keeps_copies_of_resident_nodes():
    assert _host_keeps_resident_copies(SGLangCache) == ((0, 2), (0, 0))


def test_sglang_host_evicts_least_recently_used_host_only_leaves():
    assert _host_evicts_lru_host_only_leaves(SGLangCache) == (2, 0, 2)


def test_vllm_policy_differs():
    """The same sequences under vLLM's policy: every SGLang outcome above is different."""
    assert _lookup_refreshes(KVCache) != (2, 0)
    assert _whole_leaf(KVCache) != (0, 4)
    assert _node_per_insert(KVCache) != 2
    assert _preempted_release(KVCache, finished=False) != (0, 2)
    on_insert, _, after_load, _ = _write_through(KVCache)
    assert on_insert != 2 and after_load != 2
    assert _selective(KVCache, finished=True) != 2
    assert _write_back(KVCache) != (0, 2, 2)
    assert _host_keeps_resident_copies(KVCache) != ((0, 2), (0, 0))
    assert _host_evicts_lru_host_only_leaves(KVCache) != (2, 0, 2)


def test_eviction_order_lists_whole_leaves_oldest_first():
    cache = SGLangCache(8)
    a, b = _chain(1, 2, 3), _chain(1, 2, 9)
    _hold(cache, a)
    assert cache.allocate(3)  # B computed concurrently, it shares A's first two blocks when cached:
    node, shared = cache.register(cache.root, b)  # they split off as a node of their own
    assert shared == 2
    cache.release(node, 0)
    assert cache.evictable_blocks() == [a[2], b[2], b[1], b[0]]
    assert cache.allocate(4 + 1)  # 4 free, then A's leaf
    assert cache.evictable_blocks() == [b[2], b[1], b[0]] and _gpu(cache, a) == 2


def test_shared_blocks_free_the_private_copies():
    cache = SGLangCache(4)
    blocks = _chain(7, 8)
    assert cache.allocate(2)
    first, _ = cache.register(cache.root, blocks)
    assert cache.allocate(2)  # a second request filled the same two blocks concurrently
    second, shared = cache.register(cache.root, blocks)
    assert shared == 2 and second is first and cache.free == 2
    assert cache.ref_counts() == {blocks[0]: 2, blocks[1]: 2}


def test_recomputing_a_host_only_node_makes_it_resident():
    cache = SGLangCache(2, 4)
    a = _chain(1, 2)
    _hold(cache, a)
    assert cache.allocate(2)
    cache.release(cache.root, 2)
    node = _fill(cache, a)  # computed again instead of loaded back: the blocks become its GPU copy
    assert node.hashes == a and cache.ref_counts() == {a[0]: 1, a[1]: 1} and cache.cpu_used == 2


def test_reset_forgets_unreferenced_nodes_and_host_copies():
    cache = SGLangCache(4, 4)
    a, b = _chain(1, 2), _chain(3)
    _hold(cache, a)
    _fill(cache, b)
    cache.reset()
    assert cache.ref_counts() == {b[0]: 1} and cache.available == 3 and cache.cpu_used == 0
    assert cache.lookup(a, 9).gpu_blocks == 0


def _check(cache: SGLangCache, private: int) -> None:
    """Accounting and shape: blocks add up, resident nodes form prefixes, leaves are queued."""
    resident = held = evictable = host = 0
    for node in cache._nodes():
        n = len(node.hashes)
        assert isinstance(node, RadixNode) and n
        parent = node.parent
        assert isinstance(parent, RadixNode) and parent.children[node.key] is node
        assert node.live == sum(1 for c in node.children.values() if isinstance(c, RadixNode) and c.gpu)
        if node.gpu:
            assert parent.gpu
            resident += n
            if node.ref:
                held += n
                assert parent is cache.root or parent.ref
            else:
                evictable += n
                assert bool(node.stamp) == (not node.live)  # queued exactly while a GPU leaf
        elif not node.ref:
            assert bool(node.stamp) == (not node.children)  # queued exactly while a host-only leaf
        host += n if node.host else 0
    assert evictable == cache.evictable
    assert cache.free + resident + private == cache.total
    assert host == cache.host_used <= cache.cpu_capacity
    assert cache.free >= 0 and cache.available == cache.free + cache.evictable


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(1, 10), st.integers(1, 4), st.booleans()),
        min_size=1,
        max_size=50,
    ),
    st.integers(0, 30),
    st.sampled_from(["write_through", "write_through_selective", "write_back"]),
)
def test_random_requests_keep_the_accounting(requests, cpu_blocks, policy):
    """Requests admitted as the scheduler admits them (lookup, room check, acquire, allocate, load back),
    filled in chunks and released (finished or preempted), two at a time."""
    cache = SGLangCache(12, cpu_blocks, write_policy=policy)
    outstanding = 0  # blocks allocated and not yet cached or released
    running: list[tuple[Node, int]] = []
    for family, branch, length, chunk, finished in requests:
        hashes = _chain(*[family * 100 + (i if i < branch else 50 + i) for i in range(length)])
        hit = cache.lookup(hashes, length - 1)
        g, c = hit.gpu_blocks, hit.cpu_blocks
        need = length - g
        while need > cache.available - hit.reclaim and running:
            node, private = running.pop(0)
            cache.release(node, private, finished)
            outstanding -= private
            hit = cache.lookup(hashes, length - 1)
            g, c = hit.gpu_blocks, hit.cpu_blocks
            need = length - g
        if need > cache.available - hit.reclaim:
            continue
        node = cache.acquire(hit)
        assert cache.allocate(need)
        if c:
            node = cache.load_from_cpu(node, hashes[g : g + c])
        private = need - c
        outstanding += private
        _check(cache, outstanding)
        pos = g + c
        while pos < length:
            k = min(chunk, length - pos)
            node, shared = cache.register(node, hashes[pos : pos + k])
            private -= k
            outstanding -= k  # cached, or shared and freed
            assert 0 <= shared <= k
            pos += k
            _check(cache, outstanding)
        running.append((node, private))
        if len(running) > 2:
            node, private = running.pop(0)
            cache.release(node, private, finished)
            outstanding -= private
            _check(cache, outstanding)
    for node, private in running:
        cache.release(node, private)
        outstanding -= private
    _check(cache, outstanding)
    assert cache.evictable == cache.total - cache.free


def test_the_dialect_picks_the_policy():
    base = ["meta-llama/Llama-3.3-70B-Instruct", "--tp", "4", "--enable-hierarchical-cache"]
    for extra, policy, write in (
        ([], KVCache, None),
        (["--dialect", "sglang"], SGLangCache, "write_through"),
        (["--dialect", "sglang", "--hicache-write-policy", "write_back"], SGLangCache, "write_back"),
    ):
        args = parse_args(base + extra)
        kv = cli.build_server(args, cli.resolve(args)).engine.kv
        assert type(kv) is policy and getattr(kv, "write_policy", None) == write
        assert kv.cpu_capacity == 2 * kv.total  # --hicache-ratio 2 by default
