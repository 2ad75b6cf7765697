"""The virtual-time event loop: sleeps end at once on its clock, in order; threads still wake it; a
run that can never move on says so; the engine's clock and horizon read it."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from agentsweep.virtual.clock import LoopClock, VirtualTimeLoop, VirtualTimeStalled, run_virtual


def test_an_hour_of_sleeps_ends_at_once_in_order() -> None:
    seen: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        seen.append((name, asyncio.get_running_loop().time()))

    async def main(loop: VirtualTimeLoop) -> float:
        await asyncio.gather(sleeper("hour", 3600), sleeper("second", 1), sleeper("minute", 60))
        return loop.time()

    start = time.perf_counter()
    end = run_virtual(main)
    assert time.perf_counter() - start < 5  # an hour of virtual time in (much) less than 5 s
    assert end == pytest.approx(3600)
    assert [name for name, _ in seen] == ["second", "minute", "hour"]
    assert [t for _, t in seen] == pytest.approx([1, 60, 3600])


def test_cpu_work_takes_no_virtual_time_and_unix_follows_the_clock() -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[float, float, float]:
        t0 = loop.time()
        sum(range(2_000_000))  # real CPU time, no wait
        t1 = loop.time()
        await asyncio.sleep(10)
        return t0, t1, loop.unix() - loop.origin_unix

    t0, t1, unix_elapsed = run_virtual(main)
    assert t0 == t1 == 0.0
    assert unix_elapsed == pytest.approx(10)


def test_timeouts_fire_on_the_virtual_clock() -> None:
    async def main(loop: VirtualTimeLoop) -> float:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(30):
                await asyncio.Event().wait()
        return loop.time()

    assert run_virtual(main) == pytest.approx(30)


def test_a_thread_still_wakes_the_loop() -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[str, float]:
        result = await loop.run_in_executor(None, lambda: (time.sleep(0.2), "done")[1])
        return result, loop.time()

    result, now = run_virtual(main)
    assert result == "done" and now == 0.0  # the thread's real 0.2 s took no virtual time


def test_a_run_that_cannot_move_on_says_so() -> None:
    loop = VirtualTimeLoop(stall_s=0.2)
    try:
        with pytest.raises(VirtualTimeStalled, match="no timer is pending"):
            loop.run_until_complete(asyncio.Event().wait())
    finally:
        loop.close()


def test_quiet_until_is_the_next_timer() -> None:
    async def main(loop: VirtualTimeLoop) -> list[float]:
        out = [loop.quiet_until()]
        far = loop.call_later(50, lambda: None)
        near = loop.call_later(5, lambda: None)
        out.append(loop.quiet_until())
        near.cancel()
        out.append(loop.quiet_until())
        far.cancel()
        out.append(loop.quiet_until())
        loop.call_soon(lambda: None)
        out.append(loop.quiet_until())
        return out

    assert run_virtual(main) == [math.inf, 5, 50, math.inf, 0]


def test_the_engine_clock_runs_speed_times_the_loop() -> None:
    async def main(loop: VirtualTimeLoop) -> tuple[float, float, float]:
        await asyncio.sleep(2)
        clock = LoopClock(loop, speed=50)
        await clock.sleep_until(100)  # 100 simulated s = 2 loop s at speed 50
        loop.call_later(1, lambda: None)
        return loop.time(), clock.now(), clock.horizon()

    loop_time, now, horizon = run_virtual(main)
    assert loop_time == pytest.approx(4)
    assert now == pytest.approx(100)
    assert horizon == pytest.approx(150)  # the pending timer, 1 loop s = 50 simulated s away
