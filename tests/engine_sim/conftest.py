"""Fixtures for the simulated engine: an in-process server on a free loopback port, and SSE helpers."""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from agentsweep.engine_sim import cli
from agentsweep.engine_sim.server import SimServer
from aiohttp import web


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


@dataclass
class Running:
    url: str
    server: SimServer
    session: aiohttp.ClientSession
    crashes: list[int] = field(default_factory=list)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.session.post(self.url + path, json=body) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text and text[0] in "{[" else text)

    async def stream(self, path: str, body: dict[str, Any]) -> list[str]:
        """POST a streaming request; returns the raw SSE event payloads (text after ``data: ``)."""
        async with self.session.post(self.url + path, json={**body, "stream": True}) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            raw = (await resp.read()).decode()
        assert raw.endswith("\n\n")
        events = raw.split("\n\n")[:-1]
        assert all(e.startswith("data: ") for e in events), events[:3]
        return [e[len("data: ") :] for e in events]

    @staticmethod
    def parse(events: list[str]) -> tuple[str, dict[str, Any] | None, list[dict[str, Any]]]:
        return stream_text(events)

    async def metrics(self) -> str:
        async with self.session.get(self.url + "/metrics") as resp:
            assert resp.status == 200
            return await resp.text()


@asynccontextmanager
async def _serve(argv: list[str]) -> AsyncIterator[Running]:
    args = parse_args(argv)
    setup = cli.resolve(args)
    server = cli.build_server(args, setup)
    crashes: list[int] = []
    server.config.crash = lambda: crashes.append(1)
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            yield Running(f"http://127.0.0.1:{port}", server, session, crashes)
    finally:
        await runner.cleanup()


@pytest.fixture
def sim() -> Callable[[list[str]], AbstractAsyncContextManager[Running]]:
    """``async with sim([...engine-sim flags...]) as s:`` runs a server in this event loop."""
    return _serve


def stream_text(events: list[str]) -> tuple[str, dict[str, Any] | None, list[dict[str, Any]]]:
    """Joined content/text, the usage object (if any) and the decoded chunks of an SSE stream."""
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = []
    usage = None
    for c in chunks:
        if c.get("usage"):
            usage = c["usage"]
        for ch in c["choices"]:
            text.append(ch.get("text") or ch.get("delta", {}).get("content") or "")
    return "".join(text), usage, chunks
