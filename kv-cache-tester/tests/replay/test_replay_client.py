"""SSE client timing with a scripted clock and a scripted stream (no socket)."""

from __future__ import annotations

import asyncio
import json

import pytest
from kv_cache_tester.replay.client import StreamTimer, classify_http, send
from kv_cache_tester.replay.http import Endpoint, Reader


class ScriptedClock:
    """Each reading advances time by one tick (10 ms)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.01
        return self.now


class FakeConnection:
    """Hands the response to the reader as a connection would: the head, then each read with the
    clock reading taken as it arrived."""

    reused = False

    def __init__(self, status: int, reads: list[bytes], clock: ScriptedClock) -> None:
        self.status = status
        self.reads = list(reads)
        self.clock = clock

    async def exchange(self, request: list[bytes], reader: Reader) -> None:
        body = reader.head(self.status, {"content-type": "text/event-stream; charset=utf-8"})
        for data in self.reads:
            if not body(data, self.clock()):
                return


class FakeEndpoint:
    def __init__(self, status: int, reads: list[bytes], clock: ScriptedClock) -> None:
        self.conn = FakeConnection(status, reads, clock)

    def request(self, body: bytes, headers: object) -> list[bytes]:
        return [body]

    async def connection(self, fresh: bool = False) -> FakeConnection:
        return self.conn

    def release(self, conn: FakeConnection) -> None:
        return None


def chunk(content: str | None = None, usage: dict | None = None, reasoning: str | None = None) -> bytes:
    obj: dict = {"choices": []}
    if content is not None or reasoning is not None:
        delta: dict = {}
        if content is not None:
            delta["content"] = content
        if reasoning is not None:
            delta["reasoning_content"] = reasoning
        obj["choices"] = [{"index": 0, "delta": delta}]
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE = {"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 64}}
DONE = b"data: [DONE]\n\n"


def run_send(status: int, reads: list[bytes]):
    clock = ScriptedClock()
    out = asyncio.run(send(FakeEndpoint(status, reads, clock), b"{}", {}, 5, clock=clock))  # type: ignore[arg-type]
    return out, clock


def test_e2e_minus_ttft_is_sum_of_itls_and_usage_does_not_extend_e2e():
    reads = [chunk(""), chunk("a"), chunk("b"), chunk("c"), chunk(usage=USAGE), DONE]
    out, _ = run_send(200, reads)
    assert out.ok
    # send() reads the clock once at start, then once per read: first token is on read 2
    assert out.ttft == pytest.approx(0.02)
    assert out.e2e == pytest.approx(0.04)  # last token read, not the usage read (0.05) nor [DONE]
    assert len(out.itls) == 2
    assert out.e2e - out.ttft == pytest.approx(sum(out.itls))
    assert (out.prompt_tokens, out.cached_tokens, out.completion_tokens) == (100, 64, 3)
    assert out.tpot == pytest.approx((0.04 - 0.02) / 2)


def test_reasoning_token_counts_as_first_token():
    out, _ = run_send(200, [chunk(reasoning="think"), chunk("x"), DONE])
    assert out.ok and out.ttft == pytest.approx(0.01) and out.token_events == 2


def test_usage_only_stream_is_a_failure():
    out, _ = run_send(200, [chunk(usage=USAGE), DONE])
    assert not out.ok
    assert out.error_class == "empty_stream"
    assert out.prompt_tokens == 100  # usage is still recorded


def test_stream_without_done_is_a_cut():
    out, _ = run_send(200, [chunk("a"), chunk("b")])
    assert not out.ok and out.error_class == "stream_cut" and out.token_events == 2


def test_events_split_across_reads_and_crlf():
    whole = chunk("a").replace(b"\n", b"\r\n") + chunk("b") + DONE
    reads = [whole[:7], whole[7:30], whole[30:]]
    out, _ = run_send(200, reads)
    assert out.ok and out.token_events == 2


def test_http_errors_are_classified():
    out, _ = run_send(400, [b'{"error":{"message":"This model\'s maximum context length is 8192 tokens"}}'])
    assert out.error_class == "context_length" and "maximum context length" in (out.error_message or "")
    out, _ = run_send(503, [b"busy"])
    assert out.error_class == "http_503"
    assert classify_http(400, "bad field") == "http_400"


def test_error_event_mid_stream():
    reads = [chunk("a"), b'data: {"error": {"message": "prompt is too long", "code": 400}}\n\n', DONE]
    out, _ = run_send(200, reads)
    assert not out.ok and out.error_class == "context_length"


def test_stream_timer_counts_events_read_together_as_zero_gaps():
    timer = StreamTimer(0.0)
    timer.feed(chunk("a") + chunk("b") + chunk("c"), 1.0)
    timer.feed(DONE, 1.5)
    out = timer.finish()
    assert out.ok and out.itls == [0.0, 0.0] and out.ttft == 1.0 and out.e2e == 1.0


@pytest.mark.integration
def test_connect_error_on_closed_port():
    async def go():
        # bind then close a socket: nothing listens on that port afterwards
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return await send(Endpoint(f"http://127.0.0.1:{port}/v1/chat/completions"), b"{}", {}, 5)

    out = asyncio.run(go())
    assert not out.ok and out.error_class == "connect"
