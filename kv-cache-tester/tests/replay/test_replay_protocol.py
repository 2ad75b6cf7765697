"""Strict protocol rules of the streaming client, against real servers on loopback.

Each server here answers with a scripted body: an SSE stream that breaks one rule, or a reply that is
not a stream at all, or (a raw TCP server) bytes that are, or are not, HTTP/1.1 framed in every way
a server may frame them. The client must end the request with the right error class and, for a
protocol error, stop reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from kv_cache_tester.replay.client import CONNECTION_CLASSES, Outcome, StreamTimer, send
from kv_cache_tester.replay.http import Endpoint

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
        async with scripted(chunks, content_type, written) as url:
            endpoint = Endpoint(url)
            try:
                return await send(endpoint, b"{}", {}, 20, **send_args)  # type: ignore[arg-type]
            finally:
                endpoint.close()

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


@pytest.mark.integration
def test_a_large_body_is_sent_whole_on_a_kept_connection():
    body = b'{"prompt":"' + b"word " * 40_000 + b'"}'  # larger than one socket write
    seen: list[int] = []

    async def echo_len(request: web.Request) -> web.StreamResponse:
        seen.append(len(await request.read()))
        resp = web.StreamResponse(headers={"Content-Type": SSE})
        await resp.prepare(request)
        await resp.write(tok() + DONE)
        return resp

    async def go() -> list[Outcome]:
        app = web.Application(client_max_size=1 << 22)
        app.router.add_post("/v1/completions", echo_len)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        endpoint = Endpoint(f"http://127.0.0.1:{runner.addresses[0][1]}/v1/completions")
        try:
            return [await send(endpoint, body, {}, 10) for _ in range(3)]
        finally:
            endpoint.close()
            await runner.cleanup()

    outs = asyncio.run(go())
    assert all(o.ok for o in outs) and seen == [len(body)] * 3


@pytest.mark.integration
def test_request_timeout_covers_a_stalled_stream():
    """send() enforces its timeout itself: a stream that stops mid-way times out."""

    async def go() -> Outcome:
        async with raw_server(
            [(_head("Transfer-Encoding: chunked") + _chunk(tok()), 0.0), (b"", 5.0)]
        ) as url:
            endpoint = Endpoint(url)
            try:
                return await send(endpoint, b"{}", {}, 0.3)
            finally:
                endpoint.close()

    out = asyncio.run(go())
    assert not out.ok and out.error_class == "timeout" and out.ttft is not None
    assert out.error_message == "no complete response within 0.3 s"


# --- HTTP/1.1 framing, byte by byte --------------------------------------------------------------


def _head(*lines: str, status: str = "200 OK") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: text/event-stream\r\n"
        + "".join(f"{x}\r\n" for x in lines)
        + "\r\n"
    ).encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


STREAM = tok("a") + tok("b") + usage() + DONE


@contextlib.asynccontextmanager
async def raw_server(
    script: list[tuple[bytes, float]], keep: bool = False, requests: list[bytes] | None = None
) -> AsyncIterator[str]:
    """A TCP server on loopback that answers a request with ``script``: (bytes, seconds to wait
    before writing them); then it closes the connection, or with ``keep`` waits for the next request.
    ``requests`` gets each request's head, after the client's port."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.lower().split(b"\r\n")
                length = next(int(x.split(b":")[1]) for x in lines if x.startswith(b"content-length"))
                await reader.readexactly(length)
                if requests is not None:
                    requests.append(b"%d " % writer.get_extra_info("peername")[1] + head)
                for data, wait in script:
                    if wait:
                        await asyncio.sleep(wait)
                    writer.write(data)
                    await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
    finally:
        server.close()


def raw_post(
    script: list[tuple[bytes, float]], n: int = 1, keep: bool = False, requests: list[bytes] | None = None
) -> list[Outcome]:
    async def go() -> list[Outcome]:
        async with raw_server(script, keep, requests) as url:
            endpoint = Endpoint(url)
            try:
                return [await send(endpoint, b"{}", {"X-Request-ID": f"r{i}"}, 10) for i in range(n)]
            finally:
                endpoint.close()

    return asyncio.run(go())


@pytest.mark.integration
@pytest.mark.parametrize(
    "framing",
    ["chunked", "chunked with extensions and trailers", "content-length", "until close", "1xx first"],
)
def test_every_framing_of_a_response_reads_the_same(framing: str):
    if framing == "chunked":
        events = [tok("a"), tok("b"), usage(), DONE]
        response = _head("Transfer-Encoding: chunked") + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n"
    elif framing == "chunked with extensions and trailers":
        response = (
            _head("Transfer-Encoding: chunked")
            + b"%x;name=x\r\n" % len(STREAM)
            + STREAM
            + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"
        )
    elif framing == "content-length":
        response = _head(f"Content-Length: {len(STREAM)}") + STREAM
    elif framing == "until close":
        response = _head("Connection: close") + STREAM
    else:
        response = b"HTTP/1.1 100 Continue\r\n\r\n" + _head(f"Content-Length: {len(STREAM)}") + STREAM
    whole = raw_post([(response, 0.0)])[0]
    assert whole.ok and whole.token_events == 2 and whole.prompt_tokens == 100, whole.error_message
    # the same bytes in pieces of every size, each written apart
    for size in (1, 2, 3, 5, 8, 13):
        pieces = [
            (response[i : i + size], 0.001 if i % 97 == 0 else 0.0) for i in range(0, len(response), size)
        ]
        out = raw_post(pieces)[0]
        assert out.ok and out.token_events == 2 and out.prompt_tokens == 100, (size, out.error_message)


@pytest.mark.integration
def test_a_kept_alive_connection_serves_the_next_request_and_a_closed_one_does_not():
    response = _head("Transfer-Encoding: chunked") + _chunk(STREAM) + b"0\r\n\r\n"
    heads: list[bytes] = []
    outs = raw_post([(response, 0.0)], n=3, keep=True, requests=heads)
    assert all(o.ok and o.retries == 0 for o in outs) and len(heads) == 3
    assert len({h.split()[0] for h in heads}) == 1  # one client port: one connection served all three
    closing = _head("Transfer-Encoding: chunked", "Connection: close") + _chunk(STREAM) + b"0\r\n\r\n"
    outs = raw_post([(closing, 0.0)], n=3)  # the server closes after each: a new connection each time
    assert all(o.ok and o.retries == 0 for o in outs)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("response", "needle"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x status line"),
        (_head("Transfer-Encoding: chunked") + b"zz\r\n" + STREAM, "a bad chunk-size line"),
        (_head("Transfer-Encoding: chunked") + b"4\r\nabcdXY", "a chunk that does not end with CRLF"),
        (_head("Content-Length: nine"), "a bad Content-Length"),
        (_head("Transfer-Encoding: gzip"), "unknown transfer coding"),
        (b"HTTP/1.1 200 OK\r\nbroken header line\r\n\r\n", "a malformed header line"),
    ],
)
def test_bytes_that_are_not_http_are_a_protocol_error(response: bytes, needle: str):
    out = raw_post([(response, 0.0), (b"", 0.2)])[0]
    assert not out.ok and out.error_class == "protocol" and needle in (out.error_message or ""), (
        out.error_message
    )
    assert out.error_class not in CONNECTION_CLASSES


@pytest.mark.integration
def test_a_connection_cut_mid_body_is_a_stream_cut_and_before_the_head_a_connect_error():
    cut = raw_post([(_head("Transfer-Encoding: chunked") + _chunk(tok()) + b"40\r\ndata", 0.0)])[0]
    assert not cut.ok and cut.error_class == "stream_cut" and cut.ttft is not None and cut.accepted
    none = raw_post([(b"", 0.0)])[0]
    assert not none.ok and none.error_class == "connect" and not none.accepted
