"""The eager body-write task factory: semantics of the tasks it makes, and a real aiohttp POST."""

from __future__ import annotations

import asyncio
import sys

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


def test_real_post_sends_the_whole_body():
    body = b'{"prompt":"' + b"word " * 40_000 + b'"}'  # larger than one socket write

    async def echo_len(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    async def go() -> list[str]:
        app = web.Application(client_max_size=1 << 22)
        app.router.add_post("/v1/completions", echo_len)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        got = []
        try:
            with eager_body_writes(asyncio.get_running_loop()):
                async with aiohttp.ClientSession() as session:
                    for _ in range(3):
                        async with session.post(f"http://127.0.0.1:{port}/v1/completions", data=body) as r:
                            got.append(await r.text())
        finally:
            await runner.cleanup()
        return got

    assert asyncio.run(go()) == [str(len(body))] * 3


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
        app = web.Application()
        app.router.add_post("/v1/chat/completions", stall)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                return await send(session, url, b"{}", {}, aiohttp.ClientTimeout(total=0.3))
        finally:
            await runner.cleanup()

    out = asyncio.run(go())
    assert not out.ok and out.error_class == "timeout" and out.ttft is not None
    assert out.error_message == "no complete response within 0.3 s"
