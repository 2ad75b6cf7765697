"""Strict protocol rules of the streaming client, against real aiohttp servers on loopback.

Each server here answers with a scripted body: an SSE stream that breaks one rule, or a reply that is
not a stream at all. The client must end the request with the right error class and, for a
protocol error, stop reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from kv_cache_tester.replay.client import CONNECTION_CLASSES, Outcome, StreamTimer, send

SSE = "text/event-stream"


def tok(text: str = " tok") -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


def usage(prompt: object = 100, completion: object = 3, cached: object = 64) -> bytes:
    obj = {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


@contextlib.asynccontextmanager
async def scripted(
    chunks: list[bytes], content_type: str = SSE, written: list[int] | None = None
) -> AsyncIterator[str]:
    """A real server on a free loopback port whose POST answer is ``chunks``, written one by one
    (the size of each chunk it could write is appended to ``written``)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for chunk in chunks:
                await resp.write(chunk)
                if written is not None:
                    written.append(len(chunk))
            await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
    finally:
        await runner.cleanup()


def post(
    chunks: list[bytes], content_type: str = SSE, written: list[int] | None = None, **send_args: int
) -> Outcome:
    async def go() -> Outcome:
        async with scripted(chunks, content_type, written) as url, aiohttp.ClientSession() as session:
            return await send(session, url, b"{}", {}, aiohttp.ClientTimeout(total=20), **send_args)  # type: ignore[arg-type]

    return asyncio.run(go())


@pytest.mark.integration
def test_a_well_formed_stream_is_ok():
    out = post([tok(), tok(), usage(), DONE])
    assert out.ok and out.token_events == 2
    assert (out.prompt_tokens, out.completion_tokens, out.cached_tokens) == (100, 3, 64)


@pytest.mark.integration
def test_an_event_that_is_not_json_is_a_protocol_error():
    out = post([tok(), b"data: hello world\n\n", tok(), DONE])
    assert not out.ok and out.error_class == "protocol"
    assert "not JSON" in (out.error_message or "") and "hello world" in (out.error_message or "")


@pytest.mark.integration
def test_an_event_that_is_json_but_not_an_object_is_a_protocol_error():
    out = post([tok(), b"data: [1, 2]\n\n", DONE])
    assert out.error_class == "protocol" and "not a JSON object" in (out.error_message or "")


@pytest.mark.integration
def test_tokens_after_done_are_a_protocol_error():
    out = post([tok(), DONE, tok(), tok()])
    assert not out.ok and out.error_class == "protocol"
    assert "after [DONE]" in (out.error_message or "")


@pytest.mark.integration
def test_an_html_200_is_a_protocol_error_not_a_connection_error():
    out = post([b"<html><body>Welcome to nginx</body></html>"], content_type="text/html")
    assert not out.ok and out.error_class == "protocol"
    assert "text/html" in (out.error_message or "") and "nginx" in (out.error_message or "")
    assert out.error_class not in CONNECTION_CLASSES


@pytest.mark.integration
def test_a_non_streamed_json_reply_is_a_protocol_error():
    body = json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 3}})
    out = post([body.encode()], content_type="application/json")
    assert out.error_class == "protocol" and "application/json" in (out.error_message or "")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("figures", "needle"),
    [
        ({"prompt": 100, "cached": 10_000_000}, "cached_tokens 10000000 > prompt_tokens 100"),
        ({"prompt": -5, "cached": 0}, "prompt_tokens is negative: -5"),
        ({"cached": -1}, "cached_tokens is negative: -1"),
        ({"completion": -3}, "completion_tokens is negative: -3"),
        ({"completion": "3"}, "completion_tokens is not an integer"),
    ],
)
def test_usage_that_cannot_be_true_is_bad_usage_with_the_figures_kept(figures: dict, needle: str):
    out = post([tok(), tok(), usage(**figures), DONE])
    assert not out.ok and out.error_class == "bad_usage"
    assert needle in (out.error_message or "")
    assert out.usage is not None
    for key, value in figures.items():
        name = {"prompt": "prompt_tokens", "completion": "completion_tokens", "cached": "cached_tokens"}[key]
        assert out.usage[name] == (value if isinstance(value, int) else repr(value))
    assert out.ttft is not None  # the timings are kept too


@pytest.mark.integration
def test_an_event_over_the_bound_is_a_protocol_error_and_reading_stops():
    big = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * (3 << 20) + b'"}}]}\n\n'
    pieces = [big[i : i + 65536] for i in range(0, len(big), 65536)]
    written: list[int] = []
    flood = [b"z" * (1 << 20)] * 128  # what the server would go on sending
    out = post([tok(), *pieces, *flood, tok(), DONE], written=written, max_event=1 << 20)
    assert out.error_class == "protocol" and "longer than 1048576 bytes" in (out.error_message or "")
    assert sum(written) < 64 << 20, "the client read on after the protocol error"
    # the same stream within a larger bound is fine
    assert post([tok(), *pieces, tok(), DONE], max_event=4 << 20).ok


def test_the_reader_never_holds_more_than_the_bound():
    bound = 1 << 20
    timer = StreamTimer(0.0, max_event=bound)
    timer.feed(tok(), 0.1)
    piece = b"y" * 65536
    timer.feed(b'data: {"choices":[{"delta":{"content":"', 0.2)
    fed = 0
    while not timer.broken:
        timer.feed(piece, 0.3)
        fed += len(piece)
        assert len(timer._pending) <= bound + len(piece)
        assert fed < 2 * bound, "a too-long event was never cut"
    assert len(timer._pending) == 0
    assert timer.finish().error_class == "protocol"


def test_events_split_anywhere_parse_the_same():
    """Every split point of a stream, CRLF line ends included: the same tokens and usage."""
    stream = (tok("a") + tok("b") + usage() + DONE).replace(b"\n", b"\r\n")
    for cut in range(1, len(stream)):
        for step in (1, 7):
            timer = StreamTimer(0.0)
            reads = [stream[:cut]] + [stream[i : i + step] for i in range(cut, len(stream), step)]
            for i, data in enumerate(reads):
                timer.feed(data, float(i))
            out = timer.finish()
            assert out.ok, (cut, step, out.error_message)
            assert out.token_events == 2 and out.prompt_tokens == 100
        if cut > 60:
            break


def test_multi_line_data_and_comments_follow_the_sse_rules():
    timer = StreamTimer(0.0)
    timer.feed(
        b': keep-alive\n\nevent: message\ndata: {"choices":[{"delta":\ndata: {"content":"a"}}]}\n\n', 1
    )
    timer.feed(DONE, 2)
    out = timer.finish()
    assert out.ok and out.token_events == 1
