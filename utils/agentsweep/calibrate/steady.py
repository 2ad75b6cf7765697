"""A fast stand-in for a calibration run: the simulated engine's scheduler and step model, without
HTTP, replayer or wall clock, driven by a closed loop of users in simulated time.

It mirrors ``engine_sim.scheduler.Engine`` for what a random-prompt benchmark exercises (no prefix
hits, a pool large enough not to preempt): each step, running requests first (a decode takes one
token, a prefill a chunk of the remaining budget), then waiting requests in arrival order while the
token budget lasts (those the scheduler has taken in: with a receive interval, only at its receive
points). A user whose request finishes sends the next one at once; it arrives while the
next step is already under way (as over HTTP), so it waits for that step to end. Runs of decode steps
alike (until a request finishes or a waiting one can be taken) are summed in closed form, so a row
costs tens of milliseconds. ``agentsweep calibrate --fit`` fits against this; ``agentsweep calibrate``
then checks the result through the real path.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentsweep.engine_sim.profiles import StepCost
from agentsweep.engine_sim.scheduler import ReceiveSkipper

if TYPE_CHECKING:
    from agentsweep.calibrate.points import Point

# Request cycles per user simulated (the first, all users arriving at once, is left out): the published
# client sends ten times the concurrency in prompts, so ten per user.
CYCLES = 10
# The published client draws each request's input and output lengths uniformly from the integers
# [int(L * ratio), L] for the row's nominal L (InferenceX runs its serving benchmark with
# --random-range-ratio 0.8 in every workflow since 2025): a request averages 0.9 L each way, and no two
# users stay phase-locked in groups that always prefill together. The real-path runs draw the same way.
RANGE_RATIO = 0.8
KV_CACHE_DTYPE = "fp8"  # the rows do not say; BF16 would not hold the largest rows' users in the pool
CHUNK = 16384  # the simulated engine's --chunked-prefill-size in calibration runs
# The first wave's requests arrive this far apart (user i at i times it), as a client's do: it opens
# its users' requests one after another (the replayer about 0.3 ms apart on the calibration path).
# With lengths that vary by up to 20% it moves no row's figures by more than 1%.
FIRST_WAVE_STAGGER_S = 0.3e-3


def length_bounds(nominal: int) -> tuple[int, int]:
    """The range a request's input or output length is drawn from (uniformly, integers) for a row's
    nominal ``isl`` or ``osl``."""
    return max(1, int(nominal * RANGE_RATIO)), nominal


@dataclass(frozen=True, slots=True)
class Prediction:
    tput_per_gpu: float  # total (input + output) tokens/s per GPU
    median_intvty: float  # tokens/s per user (1 / TPOT)
    median_ttft_s: float
    requests: int  # requests measured (after the first wave)


@dataclass(slots=True)
class _Req:
    arrival: float
    isl: int
    osl: int
    computed: int = 0
    generated: int = 0
    first_token: float = -1.0


@dataclass(frozen=True, slots=True)
class Timeline:
    """One finished request as a calibration figure needs it (simulated seconds)."""

    arrival: float
    first_token: float
    finish: float
    prompt_tokens: int
    output_tokens: int
    preemptions: int = 0


def measured(requests: Sequence[Timeline]) -> list[Timeline]:
    """The requests a row's figures are taken over: those that arrived once the first had finished
    (the first wave, every user arriving at once, is left out), or all of them if there are none."""
    if not requests:
        return []
    first_finish = min(r.finish for r in requests)
    return [r for r in requests if r.arrival >= first_finish] or list(requests)


def figures(requests: Sequence[Timeline], users: int, gpus: int) -> Prediction:
    """A row's figures over its measured requests, the same for the stand-in and the real path.

    Throughput is that of ``users`` users that always have a request in flight: each user's requests
    follow one another, so the rate is ``users`` x tokens per request-second (Little's law). A window
    from the first measured arrival to the last finish would undercount: requests still in flight at
    either edge use the engine there but are not measured, and with lengths that vary no two users'
    requests line up with the window's edges. A figure nothing measures is NaN."""
    tokens = sum(r.prompt_tokens + r.output_tokens for r in requests)
    busy = sum(r.finish - r.arrival for r in requests)
    intv = [
        (r.output_tokens - 1) / (r.finish - r.first_token)
        for r in requests
        if r.output_tokens > 1 and r.finish > r.first_token
    ]
    ttft = [r.first_token - r.arrival for r in requests]
    return Prediction(
        users * tokens / busy / gpus if busy > 0 else math.nan,
        _median(intv),
        _median(ttft),
        len(requests),
    )


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def closed_loop(
    cost: StepCost,
    users: int,
    isl: int,
    osl: int,
    gpus: int,
    budget: int = 16384,
    seed: int = 0,
    cycles: int = CYCLES,
    recv_interval: int = 1,
) -> Prediction:
    """Steady-state figures of ``users`` users sending prompts of about ``isl`` tokens for about ``osl``
    tokens each (drawn as the published client draws them, :func:`length_bounds`).

    ``recv_interval`` is SGLang's ``--scheduler-recv-interval``: while only decode steps run, the
    scheduler takes in new requests once every that many steps; after a step with a prefill, or idle,
    at once (its receive skipper's weights)."""
    rng = random.Random(f"closed-loop:{seed}")
    in_lo, in_hi = length_bounds(isl)
    out_lo, out_hi = length_bounds(osl)

    def request(arrival: float) -> _Req:
        return _Req(arrival, rng.randint(in_lo, in_hi), rng.randint(out_lo, out_hi))

    waiting: deque[_Req] = deque(request(i * FIRST_WAVE_STAGGER_S) for i in range(users))
    running: list[_Req] = []
    done: list[tuple[_Req, float]] = []
    t = 0.0
    target = users * cycles
    recv = ReceiveSkipper(recv_interval)
    while len(done) < target:
        recv.look(t)
        room = budget
        sched: list[tuple[_Req, int]] = []
        for r in running:
            if room <= 0:
                break
            n = 1 if r.computed >= r.isl else min(r.isl - r.computed, room)
            sched.append((r, n))
            room -= n
        while waiting and room > 0 and waiting[0].arrival + cost.admit_s <= recv.received:
            r = waiting.popleft()
            n = min(r.isl, room)
            running.append(r)
            sched.append((r, n))
            room -= n
        if not sched:
            t = max(t, waiting[0].arrival + cost.admit_s)
            recv.idle()
            continue
        prefill = decode = kv = 0
        pairs = 0.0
        for r, n in sched:
            if r.computed >= r.isl:
                decode += 1
            else:
                prefill += n
                pairs += n * (r.computed + (n + 1) / 2)
            kv += r.computed + n
        dt = cost.time(prefill, decode, kv, pairs)
        k = 1
        if not prefill and len(sched) == len(running):
            # decode steps alike until the next request finishes or the next arrival can be taken
            k = min(r.osl - r.generated for r, _ in sched)
            if waiting:
                reach = _steps_to_reach(cost, waiting[0].arrival + cost.admit_s - t, dt, decode, kv)
                # the first step at whose start the scheduler takes requests in, once it has arrived
                k = min(k, recv.steps_to_receive(reach))
        total = cost.decode_run(k, dt, decode, kv) if k > 1 else dt
        t += total
        recv.ran(k, prefill > 0)
        finished = []
        for r, n in sched:
            was_decoding = r.computed >= r.isl
            r.computed += n if not was_decoding else k
            if not was_decoding and r.computed < r.isl:
                continue
            r.generated += k if was_decoding else 1
            if r.first_token < 0:
                r.first_token = t if not was_decoding else r.first_token
            if r.generated >= r.osl:
                finished.append(r)
        for r in finished:
            running.remove(r)
            done.append((r, t))
            waiting.append(request(t + 1e-9))  # lands during the next step
    return figures(
        measured([Timeline(r.arrival, r.first_token, end, r.isl, r.osl) for r, end in done]), users, gpus
    )


def point_figures(p: Point, cost: StepCost, seed: int = 0, cycles: int = CYCLES) -> Prediction:
    """The stand-in's figures for a calibration row, run as a calibration run serves it (its chunk, its
    recipe's receive interval) with the step costs ``cost``."""
    return closed_loop(
        cost,
        p.conc,
        p.isl,
        p.osl,
        p.tp,
        budget=CHUNK,
        seed=seed,
        cycles=cycles,
        recv_interval=p.recv_interval,
    )


def _steps_to_reach(cost: StepCost, gap: float, step: float, batch: int, kv: int) -> int:
    """The fewest decode steps in a row (the first taking ``step``) that last at least ``gap``: the
    step at whose start a waiting request can be taken, as one step at a time would find it."""
    if gap <= step:
        return 1
    grow = cost.d * batch  # each step reads ``batch`` more KV tokens than the one before
    if grow > 0:
        k = math.ceil((-(step - grow / 2) + math.sqrt((step - grow / 2) ** 2 + 2 * grow * gap)) / grow)
    else:
        k = math.ceil(gap / step)
    k = max(k, 1)
    while k > 1 and cost.decode_run(k - 1, step, batch, kv) >= gap:
        k -= 1
    while cost.decode_run(k, step, batch, kv) < gap:
        k += 1
    return k
