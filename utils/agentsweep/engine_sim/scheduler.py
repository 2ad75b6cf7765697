"""Continuous batching on a simulated clock: chunked prefill, prefix-cache admission, preemption.

The engine is a discrete-event loop. Simulated time ``t`` advances by one step time per iteration
(``profiles.StepCost``); the loop sleeps until the wall clock reaches ``t / speed`` so the simulated
clock runs ``speed`` times faster than real time. It never runs ahead of the wall clock. When Python
falls behind (many streams at a high speed-up), consecutive pure-decode steps whose start times are
already past are applied in one batch: their tokens reach each stream in one SSE chunk, the way vLLM
merges outputs for a consumer that lags, while the simulated timeline stays the same.

Per step (vLLM V1 order): running requests first (decodes take one token, prefills a chunk of the
remaining budget), then waiting requests in arrival order while the token budget, ``max_num_seqs``
and free blocks allow. When a running request needs a block and none is free, the most recently
admitted running request is preempted (its blocks freed, recomputed later) and counted.

Prefix-cache hits are looked up when a request is admitted, over whole blocks resident at that
moment, capped at ``(prompt_tokens - 1) // block_size`` blocks (the last prompt token is always
computed, as in vLLM). A preempted request's later lookups are counted apart from the exported
prefix-cache queries and hits (vLLM's ``preempted_queries``), so re-finding its own blocks neither
inflates the hit rate nor the queries. Blocks found in the CPU tier are copied back before the
request runs: it waits ``bytes / host link bandwidth`` of simulated time while other requests keep
stepping; a request that hits blocks still on their way back waits for them too. A prompt's full
blocks are cached when the step that computes them is scheduled (vLLM's ``allocate_slots``), so a
request admitted later in the same step, a sibling sub-agent sent at the same moment, hits them;
SGLang's radix cache inserts them once the step has run (``KVCache.caches_when_scheduled``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import IO, Protocol

from agentsweep.engine_sim.kv_cache import KVCache, Lookup, block_hashes
from agentsweep.engine_sim.profiles import StepCost
from agentsweep.engine_sim.prompt_memo import PromptBlocks
from agentsweep.engine_sim.request import FINISHED, LOADING, RUNNING, WAITING, SimRequest
from agentsweep.engine_sim.stats import EngineStats

log = logging.getLogger("agentsweep.engine_sim")

MAX_BATCHED_STEPS = 100_000
# When steps are already due (Python is behind the simulated clock), the loop runs them back to back
# for up to this much wall time before letting the HTTP side run: streams then send the tokens of
# several steps in one chunk, as vLLM merges outputs for a consumer that lags, instead of paying one
# write per token. Steps that are not yet due always wait, so a loop that keeps up is unchanged.
MAX_BURST_S = 0.002


def _arrival(r: SimRequest) -> float:
    return r.arrival


@dataclass(slots=True)
class _Step:
    """The next engine step as scheduled: what it computes and what its time depends on."""

    sched: list[tuple[SimRequest, int]]  # the requests it computes, and how many tokens each
    changed: bool  # a request was admitted or preempted
    prefill: int  # prefill tokens
    decode: int  # decoding sequences
    kv_read: int  # KV tokens read
    pairs: float  # prefill attention pairs: each new token x the context before it
    left: int  # the fewest tokens a decoding sequence still has to generate


class ReceiveSkipper:
    """SGLang's ``--scheduler-recv-interval``: when the scheduler takes new requests in. At the top of
    each loop it looks for them after a step with a prefill, or idle, and while only decodes run once
    every ``interval`` decode steps (its receive skipper weighs a decode step 1, a prefill 1000). A run
    of decode steps with nothing waiting may pass a receive point; the count keeps its phase. Shared by
    the engine and the calibration stand-in, so both take requests in alike."""

    __slots__ = ("decode_only", "interval", "received", "since")

    def __init__(self, interval: int = 1) -> None:
        self.interval = interval
        self.received = 0.0  # requests that arrived by then (plus the admission delay) were taken in
        self.since = 0  # decode steps since requests were last taken in
        self.decode_only = False  # the last step ran decodes only

    def look(self, t: float) -> None:
        """The top of a loop at simulated time ``t``."""
        if not self.decode_only:
            self.received, self.since = t, 0
        elif self.since >= self.interval:
            self.since %= self.interval
            if not self.since:
                self.received = t

    def ran(self, steps: int, prefill: bool) -> None:
        """A step ran (``steps`` decode steps alike, or one with a prefill)."""
        self.decode_only = not prefill
        self.since = self.since + steps if self.decode_only else 0

    def idle(self) -> None:
        """Nothing ran: the next loop takes requests in at once."""
        self.decode_only = False

    def steps_to_receive(self, steps: int) -> int:
        """The fewest decode steps, at least ``steps``, after which the next loop takes requests in."""
        return steps + -(self.since + steps) % self.interval


class SimClock:
    """Simulated seconds = wall seconds since start x speed."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._t0 = time.perf_counter()
        self.start_unix = time.time()  # the wall-clock instant simulated time 0 stands for

    def now(self) -> float:
        return (time.perf_counter() - self._t0) * self.speed

    def horizon(self) -> float:
        """Simulated time up to which nothing from outside can reach the engine: steps due before it
        may be applied at once. On the wall clock, now (a request may arrive any moment)."""
        return self.now()

    async def sleep_until(self, t: float) -> None:
        delay = (t - self.now()) / self.speed
        await asyncio.sleep(delay if delay > 0 else 0)


class VirtualClock(SimClock):
    """Simulated seconds that pass only while the engine waits: a sleep moves the clock to its end at
    once and yields to the other tasks. The engine never falls behind it, however busy the machine, so
    what a step does depends on the requests alone, never on when the process got the CPU."""

    def __init__(self) -> None:
        super().__init__(1.0)
        self._now = 0.0

    def now(self) -> float:
        return self._now

    async def sleep_until(self, t: float) -> None:
        self._now = max(self._now, t)
        await asyncio.sleep(0)


class Transfer(Protocol):
    """What a prefill or decode role does inside the engine (``disagg.KVTransfer``)."""

    pinned_blocks: int

    def admit(self, r: SimRequest, hit: Lookup) -> int:
        """A decode's prompt: take its blocks and start its transfer; the first chunk size or -1."""
        ...

    def hold(self, r: SimRequest) -> None:
        """A finished prefill: keep its blocks for its decode."""
        ...


class Engine:
    """The scheduler and its clock. A prefill or decode role plugs in as ``transfer`` (``disagg.py``)."""

    def __init__(
        self,
        cache: KVCache,
        cost: StepCost,
        clock: SimClock,
        *,
        block_size: int = 16,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 1024,
        host_link_bw: float = 50e9,
        stats: EngineStats | None = None,
        recv_interval: int = 1,
    ) -> None:
        self.kv = cache
        self.cost = cost
        self.clock = clock
        self.block_size = block_size
        self.max_batched = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.host_link_bw = host_link_bw  # bytes/s for all ranks together
        self.recv = ReceiveSkipper(recv_interval)
        self.transfer: Transfer | None = None  # the prefill or decode role's part, if the engine has one
        self.stats = stats or EngineStats()
        self.waiting: deque[SimRequest] = deque()
        self.loading: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.t = 0.0
        self.steps = 0
        # Loop iterations that computed a step, and those whose step was already due by the wall clock
        # when computed: the simulator, not the simulated hardware, was the limit for those.
        self.iterations = 0
        self.iterations_late = 0
        self.lag_wall_s = 0.0  # sum over late steps of how far (wall seconds) they were overdue
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._dirty: list[SimRequest] = []  # requests with a sink and tokens not pushed yet
        self._aborts = 0  # aborted requests not yet dropped
        # (position, block hash, resident at): the first block of each run still being copied back.
        # A prompt hits that run iff it hits past that position with that block there (chained hashes).
        self._arriving: list[tuple[int, int, float]] = []
        # Optional per-request timeline in simulated seconds (--request-log): one JSON line per
        # finished request, for measurements that must not include the wall clock's HTTP overhead.
        self.request_log: IO[str] | None = None
        # How a timeline's simulated seconds map to the wall clock (the same for every request).
        self.clock_fields = f',"speed":{float(clock.speed)!r},"clock_start_unix":{clock.start_unix!r}'

    # -- requests ------------------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def fits(self, tokens: int) -> bool:
        """Whether a request of ``tokens`` (prompt + output) can ever be held by the GPU pool."""
        return self.blocks_for(tokens) <= self.kv.total

    def submit(
        self,
        prompt: PromptBlocks | list[int],
        max_tokens: int,
        *,
        remote: bool = False,
        pin: bool = False,
        request_id: str | None = None,
    ) -> SimRequest:
        """Queue a prompt (token ids, or its length and block hashes when already known).

        ``remote``: the prompt's KV comes from a prefill instance (only the local prefix-cache miss is
        transferred). ``pin``: keep the blocks held once finished, for a decode to take.
        ``request_id``: the client's, named in the request log.
        """
        if isinstance(prompt, list):
            hashes = block_hashes(prompt, self.block_size) if self.kv.prefix_caching else []
            prompt = PromptBlocks(len(prompt), hashes)
        req = SimRequest(
            f"{next(self._ids)}", prompt.length, prompt.hashes, max(1, max_tokens), self.clock.now()
        )
        req.prefill_len = req.tokens_len
        req.remote = remote
        req.pin = pin
        req.request_id = request_id
        self.waiting.append(req)
        self._wake.set()
        return req

    def abort(self, req: SimRequest) -> None:
        """The client went away: drop the request at the next step boundary."""
        if req.status != FINISHED and not req.aborted:
            req.aborted = True
            self._aborts += 1
            self._wake.set()

    def wake(self) -> None:
        """Something changed outside the loop (blocks freed, a request aborted): look again."""
        self._wake.set()

    @property
    def pinned_blocks(self) -> int:
        """Blocks finished prefills hold for their decodes."""
        return self.transfer.pinned_blocks if self.transfer is not None else 0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.loading)

    # -- loop ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine-sim-loop")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        burst_start = time.perf_counter()
        while True:
            self._drop_aborted()
            if not (self.running or self.waiting or self.loading):
                self._flush_streams()
                self._wake.clear()
                await self._wake.wait()
                burst_start = time.perf_counter()
                continue
            if not self.running and not self.loading:
                self.t = max(self.t, self.waiting[0].arrival + self.cost.admit_s)
                self.recv.idle()
            self.recv.look(self.t)
            self._promote_loaded()
            step = self._schedule()
            sched = step.sched
            if not sched:
                if self.recv.decode_only:  # idle now: the next loop takes waiting requests in at once
                    self.recv.idle()
                    continue
                nxt = [r.ready_at for r in self.loading]
                arrival = self._next_arrival()
                if arrival is not None:
                    nxt.append(arrival)
                self._flush_streams()
                if not nxt:
                    # Nothing can run until something finishes or arrives: wait for a wake-up.
                    self._wake.clear()
                    await self._wake.wait()
                    burst_start = time.perf_counter()
                    self.t = max(self.t, self.clock.now())
                    continue
                self.t = max(self.t, min(nxt))
                await self.clock.sleep_until(self.t)
                burst_start = time.perf_counter()
                continue
            dt = self.cost.time(step.prefill, step.decode, step.kv_read, step.pairs)
            k = 1
            if not step.prefill and not step.changed:
                k = self._batch_steps(step, dt)
            total = self.cost.decode_run(k, dt, step.decode, step.kv_read) if k > 1 else dt
            end = self.t + total
            behind = self.clock.now() - end
            late = behind >= 0
            self.iterations += 1
            if late:
                self.iterations_late += 1
                self.lag_wall_s += behind / self.clock.speed
            if not late or time.perf_counter() - burst_start > MAX_BURST_S:
                self._flush_streams()
                await self.clock.sleep_until(end)
                burst_start = time.perf_counter()
            start, self.t = self.t, end
            self.steps += k
            self.recv.ran(k, step.prefill > 0)
            self._apply(sched, k, total / k, start)

    def _flush_streams(self) -> None:
        """Before the loop yields: streams get the tokens produced since they were last written."""
        if self._dirty:
            dirty, self._dirty = self._dirty, []
            for r in dirty:
                r.dirty = False
                if r.sink is not None:
                    r.sink()

    def _drop_aborted(self) -> None:
        if not self._aborts:
            return
        self._aborts = 0
        for queue in (self.running, self.loading):
            if any(r.aborted for r in queue):
                for r in [r for r in queue if r.aborted]:
                    queue.remove(r)
                    self.free_blocks(r)
                    self._finish(r, "abort")
                    self._loaded(r)
        if any(r.aborted for r in self.waiting):
            for r in [r for r in self.waiting if r.aborted]:
                self.waiting.remove(r)
                self._finish(r, "abort")

    def _promote_loaded(self) -> None:
        if self._arriving:
            self._arriving = [a for a in self._arriving if a[2] > self.t]
        if self.loading:
            ready = [r for r in self.loading if r.ready_at <= self.t]
            for r in ready:
                self.loading.remove(r)
                r.status = RUNNING
                self.running.append(r)
                self._loaded(r)

    @staticmethod
    def _loaded(r: SimRequest) -> None:
        if r.on_loaded is not None:
            callback, r.on_loaded = r.on_loaded, None
            callback()

    def _next_arrival(self) -> float | None:
        """The first request still to arrive (simulated ``t`` is behind the wall clock it came at).

        Only submitted requests can have arrived after ``t`` (a preempted one was admitted, and goes
        back to the front), and they queue in arrival order: those still to come are a suffix,
        found by bisection.
        """
        waiting = self.waiting
        admit = self.cost.admit_s  # a request can be taken this long after it arrived
        i = bisect.bisect_right(waiting, self.t - admit, key=_arrival)
        return waiting[i].arrival + admit if i < len(waiting) else None

    # -- scheduling ----------------------------------------------------------------------------
    def _schedule(self) -> _Step:
        """The next step: running requests first, then waiting ones in arrival order."""
        budget = self.max_batched
        sched: list[tuple[SimRequest, int]] = []
        kv = self.kv
        bs = self.block_size
        preempted = False
        prefill = decode = kv_read = 0
        pairs = 0.0
        left = MAX_BATCHED_STEPS
        i = 0
        running = self.running
        end = len(running)
        while i < end and budget > 0:
            r = running[i]
            computed = r.computed
            decoding = computed >= r.prefill_len
            n = 1 if decoding else min(r.prefill_len - computed, budget)
            need = -(-(computed + n) // bs) - r.held
            if need:  # a decode needs a new block once every block_size tokens
                while need > kv.available:
                    victim = running.pop()
                    end -= 1
                    self._preempt(victim)
                    preempted = True
                    if victim is r:
                        break
                if r.status != RUNNING:
                    break
                kv.allocate(need)
                r.held += need
            if decoding:
                decode += 1
                if r.max_tokens - r.generated < left:
                    left = r.max_tokens - r.generated
            else:
                if kv.caches_when_scheduled:
                    self._register_blocks(r, computed + n)
                prefill += n
                pairs += n * (computed + (n + 1) / 2)
            kv_read += computed + n
            sched.append((r, n))
            budget -= n
            i += 1
        admitted = False
        if not preempted:
            while self.waiting and budget > 0 and len(running) + len(self.loading) < self.max_seqs:
                r = self.waiting[0]
                if r.arrival + self.cost.admit_s > self.recv.received:
                    break
                n = self._admit(r, budget)
                if n < 0:
                    break
                self.waiting.popleft()
                admitted = True
                if r.status == RUNNING:
                    running.append(r)
                    sched.append((r, n))
                    budget -= n
                    prefill += n  # an admitted prompt always has a token left to compute
                    pairs += n * (r.computed + (n + 1) / 2)
                    kv_read += r.computed + n
        return _Step(sched, preempted or admitted, prefill, decode, kv_read, pairs, left)

    def _admit(self, r: SimRequest, budget: int) -> int:
        """Look the prompt up and take its blocks; returns the first chunk size, or -1 if no room."""
        kv = self.kv
        bs = self.block_size
        hit = kv.lookup(r.hashes, (r.prefill_len - 1) // bs)
        if r.remote and not r.preemptions:
            assert self.transfer is not None, "a remote prompt needs a decode role"
            return self.transfer.admit(r, hit)
        g, c = hit.gpu_blocks, hit.cpu_blocks
        reclaim = hit.reclaim  # evictable blocks the hit takes off the list
        computed = (g + c) * bs
        # A GPU hit on blocks another request is still copying back from the CPU tier: they count
        # as hits, but this request runs only once they are resident.
        arrive = 0.0
        if self._arriving:
            hashes = r.hashes
            arrive = max(
                (ready for pos, first, ready in self._arriving if pos < g and hashes[pos] == first),
                default=0.0,
            )
        wait = arrive > self.t
        n = 0 if c or wait else min(r.prefill_len - computed, budget)
        need = c + self.blocks_for(computed + n) - (g + c)
        if need > kv.available - reclaim:
            return -1
        node = kv.acquire(hit)
        kv.allocate(need)
        if c:
            node = kv.load_from_cpu(node, r.hashes[g : g + c])
        r.node = node
        r.depth = g + c
        r.held = g + need
        r.registered = g + c
        r.computed = computed
        if n and kv.caches_when_scheduled:
            self._register_blocks(r, computed + n)
        st = self.stats
        if kv.prefix_caching:
            if r.preemptions:
                # As vLLM's PrefixCacheStats: a preempted request's new lookup is kept apart, so a
                # victim finding its own blocks again does not inflate the exported queries or hits.
                st.preempted_queries += r.prefill_len
                st.preempted_hits += (g + c) * bs
            else:
                st.prefix_queries += r.prefill_len
                st.prefix_hits += g * bs
                if kv.cpu_capacity:
                    st.external_queries += r.prefill_len - g * bs
                    st.external_hits += c * bs
        if r.cached_tokens < 0:
            r.cached_tokens = computed
            r.gpu_hit_tokens = g * bs
            r.cpu_hit_tokens = c * bs
        if c or wait:
            r.status = LOADING
            r.ready_at = max(arrive, self.t + c * kv.block_bytes / self.host_link_bw)
            if c:
                self._arriving.append((g, r.hashes[g], r.ready_at))
            self.loading.append(r)
        else:
            r.status = RUNNING
        return n

    def _preempt(self, r: SimRequest) -> None:
        self.free_blocks(r, finished=False)
        r.status = WAITING
        r.prefill_len = r.tokens_len + r.generated
        r.preemptions += 1
        self.waiting.appendleft(r)
        self.stats.preemptions += 1

    def free_blocks(self, r: SimRequest, finished: bool = True) -> None:
        """Let go of a request's blocks (``finished``: False when it is preempted)."""
        if r.node is not None:
            self.kv.release(r.node, r.held - r.depth, finished)
        r.node = None
        r.depth = 0
        r.held = 0
        r.computed = 0
        r.registered = 0

    def _batch_steps(self, step: _Step, dt: float) -> int:
        """How many identical decode steps to apply at once (only steps due before the clock's
        horizon: already due on the wall clock; on a virtual one, before anything else can happen)."""
        limit = self.clock.horizon()
        arrival = self._next_arrival()  # requests already due could not be admitted; the next could
        if arrival is not None:
            limit = min(limit, arrival)
        if self.loading:
            limit = min(limit, min(r.ready_at for r in self.loading))
        if limit - self.t <= dt:
            return 1
        k = min(MAX_BATCHED_STEPS, 1 + int((limit - self.t) / dt), step.left)
        if self.waiting and self.recv.interval > 1:  # end at the next receive point: one may be due
            k = min(k, self.recv.steps_to_receive(1))
        # Drop steps that would start after the limit (step i reads i*batch more KV tokens).
        while k > 1 and self.t + self.cost.decode_run(k - 1, dt, step.decode, step.kv_read) > limit:
            k = max(1, k // 2)
        if k <= 1:
            return 1
        bs = self.block_size
        extra = sum(-(-(r.computed + k) // bs) - r.held for r, _ in step.sched)
        return k if extra <= self.kv.available else 1

    # -- applying a step -----------------------------------------------------------------------
    def _apply(self, sched: list[tuple[SimRequest, int]], k: int, dt: float, start: float) -> None:
        """The step that began at ``start`` ended at ``self.t`` (``k`` decode steps of ``dt`` each)."""
        st = self.stats
        kv = self.kv
        t = self.t
        bs = self.block_size
        itl = st.itl
        dirty = self._dirty
        decoded = 0
        finished: list[SimRequest] = []
        if k > 1:
            extra = 0
            for r, _ in sched:
                if r.aborted:
                    continue
                r.computed += k
                r.generated += k
                need = -(-r.computed // bs) - r.held
                r.held += need
                extra += need
                r.itls += [dt] * k
                r.last_token_at = t
                if r.sink is None:  # its reader wakes, or its stream takes the tokens at the next flush
                    r.event.set()
                elif not r.dirty:
                    r.dirty = True
                    dirty.append(r)
                if r.generated >= r.max_tokens:
                    finished.append(r)
            kv.allocate(extra)
            if kv.caches_output_blocks:
                for r, _ in sched:
                    if not r.aborted:
                        self._register_output(r)
            decoded = k * len(sched)
            itl.observe(dt, decoded)
        else:
            steady = 0  # decodes whose previous token came at this step's start: one ITL for all
            step = t - start
            for r, n in sched:
                if r.aborted:
                    continue
                if r.computed >= r.prefill_len:  # decoding (its first token came when prefill ended)
                    r.computed += n
                    if kv.caches_output_blocks:
                        self._register_output(r)
                    if r.last_token_at == start:
                        steady += 1
                        r.itls.append(step)
                    else:
                        gap = t - r.last_token_at
                        itl.observe(gap)
                        r.itls.append(gap)
                else:
                    r.computed += n
                    if not self.kv.caches_when_scheduled:
                        self._register_blocks(r, r.computed)
                    if r.computed < r.prefill_len:
                        continue
                    if r.first_token_at is None:
                        r.first_token_at = t
                        st.ttft.observe(t - r.arrival)
                        self._count_prompt(r)
                r.generated += 1
                decoded += 1
                r.last_token_at = t
                if r.sink is None:
                    r.event.set()
                elif not r.dirty:
                    r.dirty = True
                    dirty.append(r)
                if r.generated >= r.max_tokens:
                    finished.append(r)
            if steady:
                itl.observe(step, steady)
        st.generation_tokens += decoded
        for r in finished:
            self.running.remove(r)
            if r.pin and self.transfer is not None:
                self.transfer.hold(r)  # its decode takes the blocks, or they expire
            else:
                self.free_blocks(r)
            self._finish(r, "length")

    def _register_blocks(self, r: SimRequest, upto: int) -> None:
        """Cache the full prompt blocks up to token ``upto``: when the step that computes them is
        scheduled (vLLM's allocate_slots: a request with the same prefix admitted in the same step,
        sub-agents fanning out together, already finds them), or once it has run (SGLang)."""
        full = min(upto, r.tokens_len) // self.block_size
        if full > r.registered:
            if self.kv.prefix_caching:
                assert r.node is not None  # a request that computes holds a path
                r.node, _ = self.kv.register(r.node, r.hashes[r.registered : full])
                r.depth = full
            r.registered = full

    def _register_output(self, r: SimRequest) -> None:
        """Cache a decoding request's blocks that its generated tokens filled (the prompt's last partial
        block, then blocks of output), as vLLM caches every full block of a request. The replayer never
        sends a model's output back, so nothing hits them (each gets a hash of its own), but they hold
        a place in the eviction order, ahead of the prompt's blocks once the request lets go."""
        full = r.computed // self.block_size
        if full > r.registered and r.node is not None and self.kv.prefix_caching:
            r.node, _ = self.kv.register(r.node, [hash((r.rid, i)) for i in range(r.registered, full)])
            r.depth = r.registered = full

    def _count_prompt(self, r: SimRequest) -> None:
        if r.counted_prompt:
            return
        r.counted_prompt = True
        st = self.stats
        st.prompt_tokens += r.tokens_len
        st.prompt_local_hit += r.gpu_hit_tokens
        st.prompt_external_hit += r.cpu_hit_tokens
        st.prompt_remote_hit += r.remote_tokens
        st.prompt_local_compute += r.tokens_len - r.gpu_hit_tokens - r.cpu_hit_tokens - r.remote_tokens

    def _finish(self, r: SimRequest, reason: str) -> None:
        r.status = FINISHED
        r.finish_reason = reason
        r.finished_at = self.t
        self.stats.requests_finished[reason] = self.stats.requests_finished.get(reason, 0) + 1
        if reason != "abort":
            self.stats.e2e.observe(self.t - r.arrival)
            if self.request_log is not None:
                self.request_log.write(r.log_line(self.clock_fields))
        r.event.set()

    def reset_prefix_cache(self) -> None:
        self.kv.reset()
