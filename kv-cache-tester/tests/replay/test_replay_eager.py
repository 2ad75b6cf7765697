"""The eager body-write task factory: semantics of the tasks it makes, and a real aiohttp POST."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from kv_cache_tester.replay.eager import eager_body_writes

needs_311 = pytest.mark.skipif(sys.version_info >= (3, 12), reason="aiohttp is eager itself on 3.12+")


class ClientRequest:
    """Stands in for aiohttp's class: the factory picks coroutines by qualified name."""

    def __init__(self, log: list[str], gate: asyncio.Future[None] | None = None) -> None:
        self.log = log
        self.gate = gate

    async def write_bytes(self) -> str:
        self.log.append("first step")
        if self.gate is not None:
            await self.gate
            self.log.append("resumed")
        return "written"


async def other(log: list[str]) -> str:
    log.append("other ran")
    return "other"


@contextlib.asynccontextmanager
async def serving(
    path: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]], **app_args: int
) -> AsyncIterator[str]:
    """A real aiohttp server answering POST ``path`` on a free loopback port; yields the URL."""
    app = web.Application(**app_args)
    app.router.add_post(path, handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}{path}"
    finally:
        await runner.cleanup()


@needs_311
def test_body_writer_first_step_runs_inside_create_task():
    async def go() -> None:
        loop = asyncio.get_running_loop()
        log: list[str] = []
        with eager_body_writes(loop):
            done = asyncio.ensure_future(ClientRequest(log).write_bytes())
            assert log == ["first step"] and done.done() and done.result() == "written"

            task = loop.create_task(other(log))  # any other coroutine: a plain, lazy task
            assert log == ["first step"] and isinstance(task, asyncio.Task)
            assert await task == "other"

            gate: asyncio.Future[None] = loop.create_future()
            pending = loop.create_task(ClientRequest(log, gate).write_bytes())
            assert log[-1] == "first step" and not pending.done()
            gate.set_result(None)
            assert await pending == "written" and log[-1] == "resumed"
        assert loop.get_task_factory() is None

    asyncio.run(go())


@needs_311
def test_suspended_body_writer_can_be_cancelled():
    async def go() -> None:
        loop = asyncio.get_running_loop()
        log: list[str] = []
        with eager_body_writes(loop):
            gate: asyncio.Future[None] = loop.create_future()
            task = loop.create_task(ClientRequest(log, gate).write_bytes())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert gate.cancelled() and "resumed" not in log

    asyncio.run(go())


@pytest.mark.integration
def test_real_post_sends_the_whole_body():
    body = b'{"prompt":"' + b"word " * 40_000 + b'"}'  # larger than one socket write

    async def echo_len(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    async def go() -> list[str]:
        got = []
        async with serving("/v1/completions", echo_len, client_max_size=1 << 22) as url:
            with eager_body_writes(asyncio.get_running_loop()):
                async with aiohttp.ClientSession() as session:
                    for _ in range(3):
                        async with session.post(url, data=body) as r:
                            got.append(await r.text())
        return got

    assert asyncio.run(go()) == [str(len(body))] * 3


@pytest.mark.integration
def test_request_timeout_covers_a_stalled_stream():
    """send() enforces ClientTimeout.total itself: a stream that stops mid-way times out."""
    from kv_cache_tester.replay.client import send

    async def stall(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
        await asyncio.sleep(5)
        return resp

    async def go():
        async with serving("/v1/chat/completions", stall) as url, aiohttp.ClientSession() as session:
            return await send(session, url, b"{}", {}, aiohttp.ClientTimeout(total=0.3))

    out = asyncio.run(go())
    assert not out.ok and out.error_class == "timeout" and out.ttft is not None
    assert out.error_message == "no complete response within 0.3 s"
