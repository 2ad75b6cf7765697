"""SGLang's prefix cache policy: its radix cache's eviction and HiCache's host tier (``--dialect sglang``).

Same block accounting and interface as ``kv_cache.KVCache`` (the scheduler does not know which one it
drives); what differs is the policy, as SGLang's ``mem_cache/radix_cache.py`` and
``mem_cache/hiradix_cache.py`` keep it (docs/engine-sim.md, "SGLang's radix cache and HiCache"):

- Nodes are what was inserted: every registration of new blocks (a prefill chunk) is a node of its
  own, never merged into the run it continues, so a session's path is one node per turn and chunk.
- Each node has an access time (a logical clock here): a lookup refreshes the nodes it matches, a
  registration and a finishing request's release refresh the whole path from the root (SGLang
  inserts the request's tokens from the root then). A preempted request's release refreshes
  nothing (SGLang releases a retracted request without inserting).
- Eviction takes whole leaves (nodes no request holds, with no child resident on the GPU), least
  recently accessed first; a parent whose last resident child went becomes a leaf in its turn.
  Only the shortfall is evicted, but a node goes whole, so an eviction can free more than asked.
- Host tier (``cpu_blocks``, HiCache's host pool) is inclusive: a node backed up to the host keeps
  its copy while it is on the GPU. ``write_through`` backs a node up when it is inserted,
  ``write_through_selective`` once it has been inserted through twice, ``write_back`` only when the
  GPU evicts it. A backed-up node evicted from the GPU stays in the tree, host-only; one that is not
  backed up is dropped with what hangs below it. A full host evicts host-only leaves, least recently
  accessed first; if that does not make room the node is not backed up.
- A lookup continues past the GPU prefix through host-only nodes; such a hit is loaded back whole
  (the scheduler charges the copy) and the nodes are resident again, still backed up.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heapify, heappop, heappush
from itertools import count
from typing import cast

from agentsweep.engine_sim.cpu_tier import matched
from agentsweep.engine_sim.kv_cache import KVCache, Lookup, Node

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
DEFAULT_WRITE_POLICY = "write_through"  # SGLang's --hicache-write-policy default


class RadixNode(Node):
    """A node of SGLang's tree: a run of blocks on the GPU, on the host, or both."""

    __slots__ = ("atime", "gpu", "hits", "host", "live")

    def __init__(self, hashes: list[int], parent: Node | None, ref: int = 0) -> None:
        super().__init__(hashes, parent, ref)
        self.atime = 0  # last access (SGLang's last_access_time), in lookups and registrations
        self.gpu = True  # resident on the GPU
        self.host = False  # a copy on the host
        self.hits = 0  # insertions through it (SGLang's hit_count, for write_through_selective)
        self.live = 0  # children resident on the GPU (0: a leaf for GPU eviction)


Entry = tuple[int, int, RadixNode]  # (access time, stamp, node): valid while node.stamp == stamp


class SGLangCache(KVCache):
    """Block accounting for one engine with SGLang's radix cache and HiCache policies."""

    # SGLang inserts a chunk into the tree once its forward pass has run (cache_unfinished_req).
    caches_when_scheduled = False
    # SGLang inserts a finished request's output at the end (cache_finished_req): not modelled yet.
    caches_output_blocks = False

    def __init__(
        self,
        total_blocks: int,
        cpu_blocks: int = 0,
        prefix_caching: bool = True,
        block_bytes: int = 0,
        write_policy: str = DEFAULT_WRITE_POLICY,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"unknown HiCache write policy {write_policy!r}")
        super().__init__(total_blocks, cpu_blocks, prefix_caching, block_bytes)
        self.root = RadixNode([], None, ref=1)
        self.write_policy = write_policy
        # Inserts before a node is backed up (SGLang's write_through_threshold); write_back: never.
        self.backup_hits = {"write_through": 1, "write_through_selective": 2}.get(write_policy, 0)
        self.host_used = 0  # blocks on the host (backed-up GPU nodes and host-only nodes)
        self._clock = 0
        self._gpu_leaves: list[Entry] = []  # evictable GPU leaves by access time (lazy deletion)
        self._host_leaves: list[Entry] = []  # host-only leaves by access time (lazy deletion)

    # -- state ---------------------------------------------------------------------------------
    @property
    def cpu_used(self) -> int:
        return self.host_used

    def ref_counts(self) -> dict[int, int]:
        """Cached GPU block -> requests holding it (0: evictable)."""
        return {h: n.ref for n in self._radix_nodes() if n.gpu for h in n.hashes}

    def host_blocks(self) -> set[int]:
        """Blocks with a copy on the host."""
        return {h for n in self._radix_nodes() if n.host for h in n.hashes}

    def evictable_blocks(self) -> list[int]:
        """The evictable GPU blocks in the order they would be evicted (whole leaves, oldest first)."""
        heap = [e for e in self._gpu_leaves if e[2].stamp == e[1]]
        heapify(heap)
        order = count(self._stamps + 1)  # tie-breakers after every stamp in use
        live: dict[int, int] = {}
        out: list[int] = []
        while heap:
            node = heappop(heap)[2]
            out.extend(reversed(node.hashes))
            parent = cast(RadixNode, node.parent)
            left = live.get(id(parent), parent.live) - 1
            live[id(parent)] = left
            if not left and not parent.ref and parent is not self.root:
                heappush(heap, (parent.atime, next(order), parent))
        return out

    def _radix_nodes(self) -> list[RadixNode]:
        return cast(list[RadixNode], list(self._nodes()))

    # -- lookups -------------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[int], max_blocks: int) -> Lookup:
        """Longest prefix on the GPU, continued through host-only nodes; refreshes what it matches."""
        if not self.prefix_caching:
            return Lookup(0, 0)
        n = min(len(hashes), max_blocks)
        t = self._tick()
        node = self.root
        path: list[tuple[Node, int]] = []
        host: list[tuple[Node, int]] = []
        pos = reclaim = g = 0
        while pos < n:
            child = cast("RadixNode | None", node.children.get(hashes[pos]))
            if child is None:
                break
            m = matched(child.hashes, hashes, pos, n - pos)
            self._touch(child, t)
            if child.gpu:
                path.append((child, m))
                if not child.ref:
                    reclaim += m
                g += m
            else:
                host.append((child, m))
            pos += m
            if m < len(child.hashes):
                break
            node = child
        return Lookup(g, pos - g, reclaim, path, host)

    # -- allocation ----------------------------------------------------------------------------
    def acquire(self, hit: Lookup) -> Node:
        """Hold the GPU nodes of a lookup, and pin its host-only nodes until they are loaded back."""
        node = self._hold_path(self.root, hit.path)
        for run, m in hit.host:
            if m < len(run.hashes):
                run = self._split(run, m)
            self._unqueue(cast(RadixNode, run))
            run.ref += 1  # host-only: holding it keeps it from host eviction, blocks unchanged
        return node

    def allocate(self, n: int) -> bool:
        """Take ``n`` blocks, evicting whole least recently accessed leaves for the shortfall."""
        if n <= 0:
            return True
        if n > self.free + self.evictable:
            return False
        if n > self.free:
            self._evict(n - self.free)
        self.free -= n
        return True

    def load_from_cpu(self, node: Node, hashes: Sequence[int]) -> Node:
        """The host-only nodes a lookup pinned (``acquire``) are loaded into blocks just allocated."""
        self.bytes_cpu_to_gpu += len(hashes) * self.block_bytes
        t = self._tick()
        pos, n = 0, len(hashes)
        while pos < n:
            child = cast(RadixNode, node.children[hashes[pos]])
            assert not child.gpu and child.ref, "a host hit was not pinned"
            child.gpu = True
            cast(RadixNode, node).live += 1
            child.atime = t
            pos += len(child.hashes)
            node = child
        assert pos == n, "a host hit ended inside a node"
        return node

    def register(self, node: Node, hashes: Sequence[int]) -> tuple[Node, int]:
        """Cache blocks just filled after ``node`` (held): SGLang's insert, from the root.

        Blocks another request cached first are shared and the private copies freed; host-only
        nodes on the way take the private blocks as their GPU copy (recomputed). The rest is a new
        node. The whole path is refreshed and counted as inserted through.
        """
        if not self.prefix_caching or not hashes:
            return node, 0
        t = self._tick()
        self._insert_path(node, t)
        n = len(hashes)
        pos = shared = 0
        while pos < n:
            child = cast("RadixNode | None", node.children.get(hashes[pos]))
            if child is None:
                break
            m = matched(child.hashes, hashes, pos, n - pos)
            if m < len(child.hashes):
                child = cast(RadixNode, self._split(child, m))
            if child.gpu:
                shared += m
                self._hold(child)
                self._inserted(child)
            else:
                child.gpu = True
                cast(RadixNode, node).live += 1
                self.evictable += m  # as if resident and unheld, then held below
                self._hold(child)
            child.atime = t
            node = child
            pos += m
        if pos < n:
            new = RadixNode(list(hashes[pos:]) if pos else list(hashes), node, ref=1)
            new.atime = t
            node.children[new.key] = new
            cast(RadixNode, node).live += 1
            self._inserted(new)
            node = new
        self.free += shared
        return node, shared

    def release(self, node: Node, private: int, finished: bool = True) -> None:
        """A request lets go of its path; a finished one inserts through it first (refreshed, counted)."""
        t = self._tick() if finished else 0
        root = self.root
        while node is not root:
            rn = cast(RadixNode, node)
            if finished:
                rn.atime = t
                self._inserted(rn)
            rn.ref -= 1
            if not rn.ref:
                self.evictable += len(rn.hashes)
                if not rn.live:
                    self._enqueue(rn, self._gpu_leaves)
            node = rn.parent  # type: ignore[assignment]
        self.free += private
        self._compact()

    def reset(self) -> None:
        """Forget every node no request holds, and every host copy."""
        stack: list[RadixNode] = [cast(RadixNode, self.root)]
        while stack:
            node = stack.pop()
            node.stamp = 0
            node.host = False
            node.live = 0
            for key, child in list(node.children.items()):
                c = cast(RadixNode, child)
                if c.ref and c.gpu:
                    node.live += 1
                    stack.append(c)
                else:
                    del node.children[key]
                    c.hashes = []
        self._gpu_leaves.clear()
        self._host_leaves.clear()
        self._queued_live = 0
        self.free += self.evictable
        self.evictable = 0
        self.host_used = 0

    # -- internals -----------------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _touch(self, node: RadixNode, t: int) -> None:
        node.atime = t
        if node.stamp:  # a queued leaf keeps its place only under its new time
            self._enqueue(node, self._gpu_leaves if node.gpu else self._host_leaves)

    def _enqueue(self, node: RadixNode, heap: list[Entry]) -> None:
        if not node.stamp:
            self._queued_live += 1
        self._stamps += 1
        node.stamp = self._stamps
        heappush(heap, (node.atime, self._stamps, node))

    def _unqueue(self, node: RadixNode) -> None:
        if node.stamp:
            node.stamp = 0
            self._queued_live -= 1

    def _compact(self) -> None:
        if len(self._gpu_leaves) + len(self._host_leaves) > 2 * self._queued_live + self.COMPACT_SLACK:
            self._gpu_leaves = [e for e in self._gpu_leaves if e[2].stamp == e[1]]
            self._host_leaves = [e for e in self._host_leaves if e[2].stamp == e[1]]
            heapify(self._gpu_leaves)
            heapify(self._host_leaves)

    def _insert_path(self, node: Node, t: int) -> None:
        """An insertion from the root passes through ``node``'s path: refresh and count it."""
        root = self.root
        while node is not root:
            rn = cast(RadixNode, node)
            rn.atime = t
            self._inserted(rn)
            node = rn.parent  # type: ignore[assignment]

    def _inserted(self, node: RadixNode) -> None:
        """An insertion through a GPU node: write it to the host once it has been hit enough."""
        if self.backup_hits and node.gpu:
            node.hits += 1
            if not node.host and node.hits >= self.backup_hits and self.cpu_capacity:
                self._backup(node)

    def _backup(self, node: RadixNode) -> bool:
        k = len(node.hashes)
        if self.host_used + k > self.cpu_capacity:
            self._evict_host(k)  # as HiCache: a failed host allocation evicts the node's size
            if self.host_used + k > self.cpu_capacity:
                return False
        node.host = True
        self.host_used += k
        self.bytes_gpu_to_cpu += k * self.block_bytes
        return True

    def _hold(self, node: Node) -> None:
        if not node.ref:
            self.evictable -= len(node.hashes)
            self._unqueue(cast(RadixNode, node))
        node.ref += 1

    def _split(self, node: Node, k: int) -> Node:
        """Cut ``node`` after its first ``k`` blocks; the upper part takes its state, the lower keeps
        its identity (requests holding it, its queue entry)."""
        rn = cast(RadixNode, node)
        parent = rn.parent
        assert parent is not None
        upper = RadixNode(rn.hashes[:k], parent, ref=rn.ref)
        upper.atime, upper.gpu, upper.host, upper.hits = rn.atime, rn.gpu, rn.host, rn.hits
        upper.live = 1 if rn.gpu else 0
        del rn.hashes[:k]
        rn.key = rn.hashes[0]
        rn.parent = upper
        upper.children[rn.key] = rn
        parent.children[upper.key] = upper
        return upper

    def _evict(self, n: int) -> None:
        """Evict whole GPU leaves, least recently accessed first, until ``n`` blocks are free."""
        heap = self._gpu_leaves
        root = self.root
        done = 0
        while done < n:
            _, stamp, node = heappop(heap)
            if node.stamp != stamp:
                continue
            self._unqueue(node)
            k = len(node.hashes)
            done += k
            self.evictable -= k
            parent = cast(RadixNode, node.parent)
            parent.live -= 1
            if not node.host and self.write_policy == "write_back" and self.cpu_capacity:
                self._backup(node)
            if node.host:
                node.gpu = False
                if not node.children:
                    self._enqueue(node, self._host_leaves)
            else:
                self._drop(node)
            if not parent.live and not parent.ref and parent is not root:
                self._enqueue(parent, heap)
        self.free += done
        self.evicted_blocks += done

    def _evict_host(self, n: int) -> None:
        """Drop host-only leaves, least recently accessed first, until ``n`` blocks are freed."""
        heap = self._host_leaves
        done = 0
        while done < n and heap:
            _, stamp, node = heappop(heap)
            if node.stamp != stamp:
                continue
            self._unqueue(node)
            done += len(node.hashes)
            parent = cast(RadixNode, node.parent)
            self._drop(node)
            if not parent.gpu and not parent.children and not parent.ref:
                self._enqueue(parent, heap)

    def _drop(self, node: RadixNode) -> None:
        """Take a node off the GPU-less tree with what hangs below it (all host-only)."""
        del node.parent.children[node.key]  # type: ignore[union-attr]
        stack = [node]
        while stack:
            x = stack.pop()
            if x.host:
                self.host_used -= len(x.hashes)
            self._unqueue(x)
            stack.extend(cast(list[RadixNode], list(x.children.values())))
