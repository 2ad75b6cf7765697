"""The lane scheduler: N users replaying traces concurrently against one server.

A lane (user) leases a trace, plays it request by request (sleeping the trace's delays, fanning out
sub-agent groups and joining them before the parent's next request), releases it and, with
--recycle, leases the next one. Every request's body is built *before* the lane sleeps, so the
dispatch itself is one HTTP write; all lanes build their first request, then start together.

Every play sends at least one request (a trace that starts with sub-agent groups, or is nothing
but them, spawns them at its start), so a lane always awaits something.

With --system-idle-cap, whenever every lane and sub-agent is waiting on a delay or a join (nothing in
flight, nothing about to be sent), the pending delays are all advanced by the same amount so that the
earliest ends within the cap: the order and spacing of what is pending stay, the idle time goes.
With --warmup-one-token, a lane's first request is its warm-up primer (the whole prefix so far) and
the warm-up requests after it ask for one output token and skip their delays. A lane or sub-agent that
raises stops the run and is reported; a request whose stream stops (``--stall-timeout``) or that is
still in flight when the run gives up on it ends as a recorded failure (``stall`` or ``timeout``).
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kv_cache_tester.replay.breaker import CircuitBreaker
from kv_cache_tester.replay.client import Outcome, StreamTimer, send
from kv_cache_tester.replay.config import ReplayConfig
from kv_cache_tester.replay.http import Clock, Endpoint, RequestEndpoint
from kv_cache_tester.replay.pool import TracePool
from kv_cache_tester.replay.prompts import Built, PayloadBuilder, Scope
from kv_cache_tester.replay.record import Sent, request_record
from kv_cache_tester.replay.recorder import Recorder
from kv_cache_tester.replay.results import ABANDONED_AT_END, Phase
from kv_cache_tester.replay.summary import RunMeta
from kv_cache_tester.replay.timing import scaled_delay
from kv_cache_tester.traces.model import Request, SubAgent, SubAgentGroup, Trace

# --failed-request-threshold judges the failed share only once this many profile requests finished.
LIVE_FAILED_MIN_REQUESTS = 20
# The headers every request carries its session id in (the trace, or trace:agent): what routers'
# session-affinity policies hash on (vllm-router's consistent_hash, smg's consistent_hashing).
SESSION_HEADERS: tuple[str, ...] = ("X-Session-ID", "X-SMG-Routing-Key")


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class _Stopped(Exception):
    """Raised inside a lane when the run stops while it waits."""


@dataclass(slots=True)
class _Lane:
    index: int
    warm_left: int
    started: bool = False
    sent: int = 0  # requests this lane (and its sub-agents) dispatched
    rng: random.Random = field(default_factory=random.Random)


class Replayer:
    def __init__(
        self,
        cfg: ReplayConfig,
        traces: list[Trace],
        lanes: list[int],
        pool: TracePool,
        builder: PayloadBuilder,
        recorder: Recorder,
        start_gate: Callable[[], Awaitable[float]] | None = None,
        *,
        clock: Clock = time.perf_counter,
        unix_clock: Clock = time.time,
        endpoint: RequestEndpoint | None = None,
    ) -> None:
        """``clock`` times everything (the event loop's own clock must run with it: a virtual-time
        loop gives ``loop.time``); ``unix_clock`` dates the run's start; ``endpoint``: where requests
        go (default: HTTP to ``cfg.url``)."""
        self.cfg = cfg
        self.clock = clock
        self._unix_clock = unix_clock
        self.traces = traces
        self.lanes = lanes
        self.pool = pool
        self.builder = builder
        self.recorder = recorder
        self._start_gate = start_gate
        self.stopping = False
        self.stop_reason: str | None = None
        self.t0 = 0.0
        self.t_stop: float | None = None
        self.active_users = 0
        self.in_flight = 0
        self.idle_lanes = 0
        self._sleepers: set[asyncio.Task[Any]] = set()
        self._children: set[asyncio.Task[Any]] = set()
        self._first_dispatch: dict[int, float] = {}
        self._watch: set[StreamTimer] = set()  # requests in flight, to end stalled or abandoned ones
        self.errors: list[str] = []
        self.planned = 0
        self.sent = 0
        self._ready = 0
        self._all_ready = asyncio.Event()
        self._start = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._force = asyncio.Event()
        self.signum: int | None = None
        self._sem = asyncio.Semaphore(cfg.max_concurrent_requests) if cfg.max_concurrent_requests else None
        host, port = cfg.host_port
        self.breaker = CircuitBreaker(host, port, on_trip=lambda msg: self.stop("breaker"), clock=clock)
        self._given_endpoint = endpoint
        self._endpoint: RequestEndpoint | None = None
        # Lanes and sub-agents not waiting on a delay or a join (--system-idle-cap), and the delays
        # being waited on: key -> [target, future, timer handle].
        self._awake = 0
        self._timers: dict[object, list[Any]] = {}
        self.idle_advanced_s = 0.0  # wall seconds the idle cap advanced the pending delays by
        self._profile_done = 0
        self._profile_failed = 0

    @property
    def started(self) -> bool:
        """The lanes have started (``t0`` is the run's start from then on)."""
        return self._start.is_set()

    # -- control ---------------------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        """Stop dispatching: lanes waiting on a delay end now, requests in flight may finish."""
        if self.stopping:
            return
        self.stopping = True
        self.stop_reason = reason
        self.t_stop = self.clock()
        for task in list(self._sleepers):
            task.cancel()
        self.breaker.healthy.set()  # lanes held while the breaker probes: let them see the stop
        self._stop_event.set()

    def _fail(self, where: str, exc: BaseException) -> None:
        """A lane or sub-agent raised: keep one line for the report and stop the run."""
        self.errors.append(f"{where}: {type(exc).__name__}: {exc}")
        self.stop("error")

    def on_signal(self, signum: int) -> None:
        """First SIGINT/SIGTERM: stop dispatching and let requests in flight finish (grace period).
        A second one: abandon them now."""
        if self.stopping:
            self._force.set()
            return
        self.signum = signum
        self.stop("signal")

    def _delay(self, req: Request, prev: Request | None) -> float:
        """Seconds between the previous response and ``req``, by the run's timing options."""
        cfg = self.cfg
        return scaled_delay(
            cfg.timing_strategy,
            req,
            prev,
            max_delay=cfg.max_delay,
            time_scale=cfg.time_scale,
            api_time_scale=cfg.api_time_scale,
        )

    async def _sleep_until(self, target: float) -> None:
        if self.stopping:
            raise _Stopped
        delay = target - self.clock()
        if delay <= 0:
            return
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        key = object()
        self._timers[key] = [target, done, loop.call_later(delay, _resolve, done)]
        self._sleepers.add(task)
        self._awake -= 1
        try:
            self._idle_check()
            await done
        except asyncio.CancelledError:
            if self.stopping and task.cancelling():
                task.uncancel()
                raise _Stopped from None
            raise
        finally:
            self._timers.pop(key)[2].cancel()
            self._sleepers.discard(task)
            self._awake += 1

    def _idle_check(self) -> None:
        """--system-idle-cap: nothing in flight and everything waiting on a delay or a join; advance
        every pending delay alike so the earliest ends within the cap (x --time-scale)."""
        cap = self.cfg.system_idle_cap * self.cfg.time_scale
        if cap <= 0 or self._awake > 0 or not self._timers or self.stopping:
            return
        now = self.clock()
        shift = min(entry[0] for entry in self._timers.values()) - now - cap
        if shift <= 0:
            return
        self.idle_advanced_s += shift
        loop = asyncio.get_running_loop()
        for entry in self._timers.values():
            entry[0] -= shift
            entry[2].cancel()
            entry[2] = loop.call_later(max(0.0, entry[0] - now), _resolve, entry[1])

    async def _wait_children(self, tasks: list[asyncio.Task[Any]]) -> None:
        if tasks:
            self._awake -= 1
            try:
                self._idle_check()
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                self._awake += 1

    def _settle(self, _task: asyncio.Task[Any]) -> None:
        """A lane's or sub-agent's task is done (or was cancelled before it started): it no longer
        keeps the system from being idle."""
        self._awake -= 1
        self._idle_check()

    def _one_token(self, lane: _Lane) -> bool:
        """--warmup-one-token: a warm-up request after the lane's first asks for one token, at once."""
        return self.cfg.warmup_one_token and lane.sent > 0 and lane.warm_left > 0

    def _count_failures(self, ok: bool) -> None:
        """--failed-request-threshold: end the run once too many finished profile requests failed."""
        self._profile_done += 1
        self._profile_failed += not ok
        limit, done, failed = self.cfg.failed_request_threshold, self._profile_done, self._profile_failed
        if limit > 0 and done >= LIVE_FAILED_MIN_REQUESTS and failed > limit * done and not self.stopping:
            self.errors.append(
                f"failed requests: {failed} of {done} finished profile requests ({failed / done:.1%}), "
                f"over --failed-request-threshold {limit:g}"
            )
            self.stop("failed_requests")

    def _mark_ready(self) -> None:
        self._ready += 1
        if self._ready >= len(self.lanes):
            self._all_ready.set()

    async def _begin(self, lane: _Lane) -> None:
        """First action of a lane: say it is ready, then wait for the common start."""
        if not lane.started:
            lane.started = True
            self._mark_ready()
            await self._start.wait()
            if self.stopping:
                raise _Stopped

    # -- lanes -----------------------------------------------------------------------------------
    async def _lane(self, index: int) -> None:
        cfg = self.cfg
        warm = cfg.warmup_requests_per_user + (1 if cfg.warmup_one_token else 0)  # the primer first
        lane = _Lane(index, warm, rng=random.Random(f"{cfg.seed}:lane:{index}"))
        first_trace = True
        try:
            while not self.stopping:
                lease = self.pool.lease()
                if lease is None:
                    if first_trace:
                        self.idle_lanes += 1
                    return
                idx, play = lease
                trace = self.traces[idx]
                start = 0
                if first_trace and cfg.advance_max > 0 and len(trace.requests) > 1:
                    frac = lane.rng.uniform(cfg.advance_min, cfg.advance_max)
                    # At least one request after the warm-up is left to profile where the trace is
                    # long enough (--warmup-one-token: the primer and the one-token requests).
                    last = len(trace.requests) - 1
                    if cfg.warmup_one_token:
                        last = max(0, last - 1 - cfg.warmup_requests_per_user)
                    start = min(int(frac * len(trace.requests)), last)
                    if start > 0:
                        lane.warm_left = max(lane.warm_left, 1)
                first_trace = False
                self.active_users += 1
                sent = lane.sent
                try:
                    await self._play(lane, trace, play, start)
                finally:
                    self.active_users -= 1
                    self.pool.release(idx)
                if lane.sent == sent and not self.stopping:  # never loop without awaiting a request
                    raise RuntimeError(f"trace {trace.trace_id}: a play sent no request")
        except _Stopped:
            return
        except Exception as exc:
            self._fail(f"lane {index}", exc)
        finally:
            if not lane.started:
                lane.started = True
                self._mark_ready()

    def _phase(self, lane: _Lane) -> Phase:
        if lane.warm_left > 0:
            lane.warm_left -= 1
            return "warmup"
        return "profile"

    async def _play(self, lane: _Lane, trace: Trace, play: int, start: int) -> None:
        """One play of one trace, from parent request ``start``.

        With ``start`` > 0 (an advanced lane) the groups before request ``start`` count as finished;
        from the trace's start, a group before the first parent request is spawned at once.
        """
        self.planned += sum(1 for r in trace.requests if r.index >= start) + sum(
            len(a.requests) for g in trace.groups if not (start and g.join_index <= start) for a in g.agents
        )
        scope = self.builder.open_scope(trace, play)
        session_id = trace.trace_id
        prev: Request | None = None
        prev_end = 0.0
        group: list[asyncio.Task[Any]] = []
        try:
            for step in trace.steps():
                if isinstance(step, SubAgentGroup):
                    if start and step.join_index <= start:
                        continue
                    await self._begin(lane)
                    group = [self._spawn(lane, trace, play, scope, agent) for agent in step.agents]
                    continue
                req = step
                if req.index < start:
                    continue
                quick = self._one_token(lane)
                built = await self._build(scope, None, req, quick)
                if prev is None:
                    await self._begin(lane)
                    target = self.clock()
                else:
                    target = self.clock() if quick else prev_end + self._delay(req, prev)
                await self._sleep_until(target)
                if group:  # the join: wait for every sub-agent of the group, whatever became of them
                    await self._wait_children(group)
                    group = []
                    target = max(target, self.clock())
                if self.stopping:
                    raise _Stopped
                await self._dispatch(lane, trace, play, scope, session_id, req, built, target, quick)
                prev, prev_end = req, self.clock()
            await self._wait_children(group)
        finally:
            if self.stopping:
                # The run is ending: sub-agent requests still in flight finish within the grace
                # period or are ended and recorded as failures by it; cancelling them here would
                # lose requests the server already took.
                await self._wait_children(group)
            else:
                for task in group:
                    task.cancel()
            self.builder.close_scope(scope)

    def _spawn(
        self, lane: _Lane, trace: Trace, play: int, scope: Scope, agent: SubAgent
    ) -> asyncio.Task[Any]:
        self._awake += 1  # from its spawn: the parent must not see an idle system before it starts
        task = asyncio.get_running_loop().create_task(self._agent(lane, trace, play, scope, agent))
        self._children.add(task)
        task.add_done_callback(self._children.discard)
        task.add_done_callback(self._settle)
        return task

    async def _agent(self, lane: _Lane, trace: Trace, play: int, scope: Scope, agent: SubAgent) -> None:
        session_id = f"{trace.trace_id}:{agent.agent_id}"
        prev: Request | None = None
        prev_end = self.clock()  # the spawn
        try:
            for req in agent.requests:
                quick = self._one_token(lane)
                built = await self._build(scope, agent, req, quick)
                target = self.clock() if quick else prev_end + self._delay(req, prev)
                await self._sleep_until(target)
                if self.stopping:
                    return
                await self._dispatch(lane, trace, play, scope, session_id, req, built, target, quick)
                prev, prev_end = req, self.clock()
        except _Stopped:
            return
        except Exception as exc:
            self._fail(f"lane {lane.index} sub-agent {agent.agent_id}", exc)

    # -- one request -----------------------------------------------------------------------------
    async def _build(
        self, scope: Scope, agent: SubAgent | None, req: Request, one_token: bool = False
    ) -> Built:
        """The request's body. The blocks it needs first are made a batch at a time, letting the
        streams in flight be read in between: a new play's first prompt (hundreds of blocks, a few
        milliseconds) would otherwise hold up every arrival behind it and show in their TTFT."""
        for _ in scope.play.warm(req):
            await asyncio.sleep(0)
            if self.stopping:  # a signal or the end of the run came while a long prompt was made
                raise _Stopped
        return self.builder.build(scope, agent, req, one_token)

    async def _dispatch(
        self,
        lane: _Lane,
        trace: Trace,
        play: int,
        scope: Scope,
        session_id: str,
        req: Request,
        built: Built,
        target: float,
        one_token: bool = False,
    ) -> Outcome:
        assert self._endpoint is not None
        phase = self._phase(lane)
        header_sid = f"{session_id}/{scope.salt}" if scope.salt else session_id
        request_id = f"{header_sid}#{req.index}"
        headers = {**dict.fromkeys(SESSION_HEADERS, header_sid), "X-Request-ID": request_id}
        debug: list[tuple[float, bytes]] | None = [] if self.cfg.debug_trace else None
        if not self.breaker.healthy.is_set():  # a connection error is being probed: hold on
            await self.breaker.healthy.wait()
            if self.stopping:
                raise _Stopped
        if self._sem is not None:
            await self._sem.acquire()
            if self.stopping:
                self._sem.release()
                raise _Stopped
        self.in_flight += 1
        t_send = self.clock()
        ticket = self.builder.dispatched()
        try:
            self._first_dispatch.setdefault(lane.index, t_send - self.t0)
            out = await send(
                self._endpoint,
                built.body,
                headers,
                self.cfg.request_timeout,
                self.clock,
                debug,
                self._watch,
                self.cfg.max_event_bytes,
                on_accept=lambda: self.builder.delivered(scope, req, ticket),
            )
            t_done = self.clock()
        finally:
            self.in_flight -= 1
            if self._sem is not None:
                self._sem.release()
        lane.sent += 1
        self.sent += 1
        self.breaker.observe(None if out.ok else out.error_class)
        sent = Sent(
            trace_id=trace.trace_id,
            session_id=session_id,
            user=lane.index,
            turn=req.index,
            phase=phase,
            play=play,
            salt=scope.salt,
            request_id=request_id,
            t_dispatch=t_send - self.t0,
            dispatch_lag_s=max(0.0, t_send - target),
            expected_prompt_tokens=built.expected_prompt_tokens,
            expected_output_tokens=1 if one_token else req.out_tokens,
            total_blocks=built.total_blocks,
        )
        rec = request_record(sent, out, t_done - self.t0, self.builder.hits(scope, req, ticket))
        self.recorder.write(rec, out.itls)
        if debug:
            self.recorder.write_debug(request_id, debug)
        if phase == "profile":
            self._count_failures(out.ok)
        return out

    # -- the run ---------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        r = self.recorder
        return {
            "active": self.active_users,
            "in_flight": self.in_flight,
            "done": r.done,
            "failed": r.failed,
            "tokens": r.in_tokens + r.out_tokens,
            "out_tokens": r.out_tokens,
            "ttft_p50": r.take_recent_ttft_p50(),
        }

    async def _drain(self, lane_tasks: list[asyncio.Task[Any]], grace: float) -> None:
        """Wait up to ``grace`` seconds for requests in flight, or until a second signal."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        force_wait = loop.create_task(self._force.wait())
        try:
            pending = {t for t in lane_tasks if not t.done()}
            while pending and not self._force.is_set():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await asyncio.wait(
                    pending | {force_wait}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                pending = {t for t in lane_tasks if not t.done()}
        finally:
            force_wait.cancel()

    async def run(self) -> RunMeta:
        # The traces and everything built so far live for the whole run: keep them out of the
        # cyclic collector's scans, so its pauses (which stall every stream) stay short.
        gc.collect()
        gc.freeze()
        try:
            return await self._run()
        finally:
            gc.unfreeze()

    async def _busy_poll(self) -> None:
        """--busy-poll: while requests are in flight, keep the loop polling instead of sleeping.

        An idle process blocked in the kernel takes a while to be woken when data arrives (tens
        of microseconds on bare metal, often several hundred on a virtual machine), and that
        delay lands in every TTFT and ITL. A ready task makes each loop iteration poll without
        blocking, so arrivals are read as they land; the price is one busy core.
        """
        while True:
            if self.in_flight:
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(0.0005)

    async def _stall_watchdog(self, limit: float) -> None:
        """--stall-timeout: end a request whose stream has started and then sent nothing for
        ``limit`` seconds, as a ``stall`` failure."""
        interval = min(1.0, limit / 4)
        while True:
            await asyncio.sleep(interval)
            now = self.clock()
            for timer in list(self._watch):
                idle = now - timer.idle_since
                if timer.started and idle >= limit:
                    timer.expire(
                        "stall",
                        f"no data for {idle:.1f} s after {timer.out.token_events} token events "
                        f"(--stall-timeout {limit:g} s)",
                    )

    async def _abandon(self, lane_tasks: list[asyncio.Task[Any]]) -> None:
        """The grace period is over: end every request still in flight as a recorded failure
        (``stall`` when its stream had started and nothing came in the last second, else
        ``timeout``), give the lanes a moment to write those records, then cancel what is left."""
        now = self.clock()
        grace = now - (self.t_stop if self.t_stop is not None else now)
        for timer in list(self._watch):
            idle = now - timer.idle_since
            if timer.started and idle >= 1.0:
                timer.expire(
                    "stall",
                    f"{ABANDONED_AT_END}: no data for {idle:.1f} s "
                    f"after {timer.out.token_events} token events",
                )
            else:
                state = "still streaming" if timer.started else "no response yet"
                timer.expire("timeout", f"{ABANDONED_AT_END}: {state} {grace:.1f} s after the stop")
        pending = {t for t in [*lane_tasks, *self._children] if not t.done()}
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        for task in [*lane_tasks, *self._children]:
            task.cancel()
        await asyncio.gather(*lane_tasks, *list(self._children), return_exceptions=True)

    async def _run(self) -> RunMeta:
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        cpu0 = time.process_time()
        self._endpoint = endpoint = self._given_endpoint or Endpoint(cfg.url, clock=self.clock)
        self._awake += len(self.lanes)
        lane_tasks = [loop.create_task(self._lane(i)) for i in self.lanes]
        for task in lane_tasks:
            task.add_done_callback(self._settle)
        poller = loop.create_task(self._busy_poll()) if cfg.busy_poll else None
        if not self.lanes:
            self._all_ready.set()
        abandoned = 0
        duration_handle = None
        watchdog = None
        try:
            await self._all_ready.wait()
            self.t0 = await self._start_gate() if self._start_gate is not None else self.clock()
            t0_unix = self._unix_clock() - (self.clock() - self.t0)
            wall0 = self.clock()
            self._start.set()
            if cfg.stall_timeout > 0:
                watchdog = loop.create_task(self._stall_watchdog(cfg.stall_timeout))
            if cfg.test_duration is not None:
                duration_handle = loop.call_later(
                    max(0.0, self.t0 + cfg.test_duration - self.clock()), self.stop, "duration"
                )
            lanes_done = asyncio.gather(*lane_tasks, return_exceptions=True)
            stop_wait = loop.create_task(self._stop_event.wait())
            first: set[asyncio.Future[Any]] = {lanes_done, stop_wait}
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            self.stop("exhausted")  # no-op when already stopped for another reason
            stop_wait.cancel()
            if not lanes_done.done():
                await self._drain(lane_tasks, 1.0 if self.stop_reason == "breaker" else cfg.grace_period)
                if not lanes_done.done() or self._children:
                    abandoned = self.in_flight
                    await self._abandon(lane_tasks)
                await lanes_done
        finally:
            if duration_handle is not None:
                duration_handle.cancel()
            if watchdog is not None:
                watchdog.cancel()
            if poller is not None:
                poller.cancel()
            self.breaker.close()
            endpoint.close()
        end = self.clock()
        assert self.t_stop is not None
        return RunMeta(
            t0_unix=t0_unix,
            stop_rel=self.t_stop - self.t0,
            end_rel=end - self.t0,
            reason=self.stop_reason or "exhausted",
            first_dispatch=sorted(self._first_dispatch.values()),
            abandoned=abandoned,
            idle_lanes=self.idle_lanes,
            cpu_s=time.process_time() - cpu0,
            wall_s=end - wall0,
            itl_hist=self.recorder.itl_hist.to_dict(),
            breaker=self.breaker.tripped,
            signum=self.signum,
            errors=list(self.errors),
            planned=self.planned,
            sent=self.sent,
            idle_advanced_s=self.idle_advanced_s,
        )
