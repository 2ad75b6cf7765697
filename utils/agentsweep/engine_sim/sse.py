"""A streamed completion: its SSE events, written as the engine produces the tokens.

Shaped as vLLM streams them: ``data: {json}\\n\\n`` events, the chat role delta with the first token,
the finish reason on the last content chunk (which also carries the request's own timeline,
``sim_timeline``), a usage chunk (``choices: []``) when ``stream_options.include_usage`` is set, then
``data: [DONE]``. A chunk carries every token the engine produced since the previous chunk.

How the chunks are written matters for the simulator's CPU: at a high speed-up a request's tokens
reach its client in many chunks. The first chunk (it carries the response headers) and the last
(with the end of the chunked encoding) go through aiohttp; the ones between are pushed from the
engine's loop when it yields (one call per stream that got tokens), straight to the
connection as HTTP/1.1 chunks. Waking one task per stream and passing each chunk through aiohttp's
writer cost about twice the CPU per chunk.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from agentsweep.engine_sim import tokenizer
from agentsweep.engine_sim.request import FINISHED, SimRequest
from agentsweep.engine_sim.scheduler import Engine

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
# A client this far behind (bytes not yet taken by the kernel) gets no more chunks until it catches
# up: the tokens meanwhile merge into its next chunk, as a server's writes wait for a slow reader.
WRITE_BUFFER_LIMIT = 1 << 16


class SseStream:
    """One streamed response. ``limit``: tokens to send before stalling (the stall fault), else all."""

    __slots__ = (
        "chat",
        "close",
        "engine",
        "gone",
        "head",
        "include_usage",
        "limit",
        "mid",
        "open_",
        "req",
        "role",
        "sent",
        "transport",
    )

    def __init__(
        self,
        engine: Engine,
        req: SimRequest,
        chat: bool,
        model_json: str,
        include_usage: bool,
        limit: int,
    ) -> None:
        self.engine = engine
        self.req = req
        self.chat = chat
        self.include_usage = include_usage
        self.limit = limit
        self.sent = 0  # tokens written so far
        self.gone = False  # the client went away
        self.transport: asyncio.Transport | None = None
        created = int(time.time())
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = f'data: {{"id":"{rid}","object":"{obj}","created":{created},"model":{model_json},"choices":'
        self.head = head
        if chat:
            self.role = f'{head}[{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}}\n\n'
            self.open_ = head + '[{"index":0,"delta":{"content":"'
            self.mid = '"},"logprobs":null,"finish_reason":'
            self.close = "}]}\n\n"
        else:
            self.role = ""
            self.open_ = head + '[{"index":0,"text":"'
            self.mid = '","logprobs":null,"finish_reason":'
            self.close = ',"stop_reason":null}]}\n\n'

    # -- events --------------------------------------------------------------------------------
    def _content(self, n: int) -> str:
        """A content chunk with the next ``n`` tokens (and the role delta before the first)."""
        text = f"{self.open_}{tokenizer.output_text(self.sent, n)}{self.mid}null{self.close}"
        if not self.sent and self.role:
            text = self.role + text
        self.sent += n
        return text

    def _end(self) -> str:
        """The rest of the tokens with the finish reason and the timeline, usage, ``[DONE]``."""
        req = self.req
        n = req.generated - self.sent
        timeline = req.timeline(self.engine.clock_fields)
        text = (
            f"{self.role if not self.sent else ''}{self.open_}{tokenizer.output_text(self.sent, n)}{self.mid}"
            f'"{req.finish_reason}"{self.close[:-3]},"sim_timeline":{timeline}}}\n\n'
        )
        self.sent += n
        if self.include_usage:
            text += f'{self.head}[],"usage":{usage_json(req)}}}\n\n'
        return text + "data: [DONE]\n\n"

    # -- from the engine's loop ----------------------------------------------------------------
    def push(self) -> None:
        """The request got tokens: write them as one chunk (the handler writes the last one)."""
        req = self.req
        if req.status == FINISHED or self.gone:
            return
        transport = self.transport
        if transport is None or transport.is_closing():
            self.gone = True
            req.sink = None
            self.engine.abort(req)  # its end wakes the handler
            return
        if transport.get_write_buffer_size() > WRITE_BUFFER_LIMIT:
            return
        n = min(req.generated, self.limit) - self.sent
        if n <= 0:
            return
        data = self._content(n).encode()
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        if self.sent >= self.limit:  # the stall fault: the handler holds the connection from here
            req.sink = None
            req.event.set()

    # -- the handler's part --------------------------------------------------------------------
    async def run(
        self, request: web.Request, hold: Callable[[], Awaitable[None]] | None = None
    ) -> web.StreamResponse:
        """Write the response. ``hold`` (the stall fault): once its tokens are out, await it instead of
        ending the response (it holds the connection until the client gives up)."""
        req = self.req
        stall = hold is not None
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        try:
            await self._wait(lambda: req.generated > 0)
            if req.status != FINISHED:
                await resp.write(self._content(min(req.generated, self.limit)).encode())
                if self.sent < self.limit:
                    self.transport = request.transport
                    req.sink = self.push
                    await self._wait(lambda: self.sent >= self.limit or self.gone)
                    req.sink = None
                if self.gone:
                    raise ConnectionResetError("the client went away")
            if req.status == FINISHED:
                if self.limit >= req.generated:
                    end = self._end().encode()
                    if not stall:
                        await resp.write_eof(end)  # one write with the end of the chunked encoding
                        return resp
                    await resp.write(end)
                elif self.limit > self.sent:
                    await resp.write(self._content(self.limit - self.sent).encode())
            if hold is not None:
                await hold()
                return resp
            await resp.write_eof()
            return resp
        except (ConnectionError, asyncio.CancelledError):
            self.engine.abort(req)
            raise
        finally:
            req.sink = None

    async def _wait(self, ready: Callable[[], bool]) -> None:
        """Until ``ready()`` or the request is finished."""
        req = self.req
        while not ready() and req.status != FINISHED:
            req.event.clear()
            await req.event.wait()


def usage_json(req: SimRequest) -> str:
    """The usage object (``prompt_tokens_details.cached_tokens`` always filled)."""
    return (
        f'{{"prompt_tokens":{req.tokens_len},"total_tokens":{req.tokens_len + req.generated},'
        f'"completion_tokens":{req.generated},"prompt_tokens_details":{{"cached_tokens":{max(0, req.cached_tokens)}}}}}'
    )
