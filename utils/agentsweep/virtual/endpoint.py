"""The replayer's requests straight into a simulated engine in the same process: no socket.

``LocalEndpoint`` stands where the replayer's HTTP ``Endpoint`` stands. A request goes through the
server's own admission (``SimServer.admit``: the same validation, prompt hashing and faults as its
HTTP route), the engine computes it, and its response comes back as the same SSE bytes the HTTP
route streams (``SseStream``'s chunks), fed to the replayer's reader with the loop's clock reading.
So the client's SSE parsing, timing and records are the HTTP path's, less the network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from aiohttp import web
from kv_cache_tester.replay.http import Body, Exchanger, Reader

from agentsweep.engine_sim.request import FINISHED, SimRequest
from agentsweep.engine_sim.scheduler import Engine
from agentsweep.engine_sim.server import SimServer
from agentsweep.engine_sim.sse import SseStream

Clock = Callable[[], float]
_SEP = b"\0"  # between a header's name and value in a request (``LocalEndpoint.request``)


class LocalStream(SseStream):
    """One streamed response fed to a reader: each chunk as the engine's loop yields, as over HTTP."""

    __slots__ = ("clock", "feed")

    def __init__(
        self, engine: Engine, req: SimRequest, chat: bool, model_json: str, include_usage: bool
    ) -> None:
        super().__init__(engine, req, chat, model_json, include_usage, req.max_tokens)
        self.feed: Body | None = None
        self.clock: Clock | None = None

    def push(self) -> None:
        req = self.req
        if req.status == FINISHED or self.gone or self.feed is None or self.clock is None:
            return
        n = req.generated - self.sent
        if n > 0 and not self.feed(self._content(n).encode(), self.clock()):
            self._drop()

    def _drop(self) -> None:
        """The reader wants no more: the request ends, as when an HTTP client goes away."""
        self.gone = True
        self.req.sink = None
        self.engine.abort(self.req)

    async def run_local(self, feed: Body, clock: Clock) -> None:
        """Feed the whole response to ``feed``: the first tokens, each later chunk, then the end."""
        req = self.req
        self.feed, self.clock = feed, clock
        try:
            await self._wait(lambda: req.generated > 0)
            if req.status != FINISHED:
                if not feed(self._content(req.generated).encode(), clock()):
                    self._drop()
                    return
                req.sink = self.push
                await self._wait(lambda: self.gone)
                req.sink = None
            if not self.gone:
                feed(self._end().encode(), clock())
        except BaseException:
            self.engine.abort(req)
            raise
        finally:
            req.sink = None


class LocalConnection:
    """One request's exchange with the in-process server (a new one for every request)."""

    reused = False

    def __init__(self, server: SimServer, chat: bool, clock: Clock) -> None:
        self._server = server
        self._chat = chat
        self._clock = clock

    async def exchange(self, request: list[bytes], reader: Reader) -> None:
        body, *lines = request
        headers = dict(line.decode().split(_SEP.decode(), 1) for line in lines)
        server, clock = self._server, self._clock
        admitted = server.admit(body, headers, self._chat)
        if isinstance(admitted, web.Response):
            feed = reader.head(admitted.status, {"content-type": admitted.content_type})
            feed(bytes(admitted.body or b""), clock())  # type: ignore[arg-type]
            return
        if not admitted.body.get("stream"):
            feed = reader.head(400, {"content-type": "application/json"})
            feed(b'{"error":{"message":"the in-process engine streams only: send stream=true"}}', clock())
            return
        engine = server.engine
        req = engine.submit(admitted.prompt, admitted.max_tokens, request_id=headers.get("X-Request-ID"))
        include_usage = bool((admitted.stream_options or {}).get("include_usage"))
        stream = LocalStream(engine, req, self._chat, server.model_json, include_usage)
        await stream.run_local(reader.head(200, {"content-type": "text/event-stream"}), clock)


class LocalEndpoint:
    """The replayer's endpoint for a ``SimServer`` in this process (``RequestEndpoint``)."""

    def __init__(self, server: SimServer, chat: bool, clock: Clock) -> None:
        self._server = server
        self._chat = chat
        self._clock = clock

    def request(self, body: bytes, headers: Mapping[str, str]) -> list[bytes]:
        return [body, *(_SEP.join((name.encode(), value.encode())) for name, value in headers.items())]

    async def connection(self, fresh: bool = False) -> Exchanger:
        return LocalConnection(self._server, self._chat, self._clock)

    def release(self, conn: Exchanger) -> None:
        pass

    def close(self) -> None:
        pass
