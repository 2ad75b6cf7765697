"""The replayer's requests straight into a simulated engine in the same process: no socket.

``LocalEndpoint`` stands where the replayer's HTTP ``Endpoint`` stands. A request goes through the
server's own admission (``SimServer.admit``: the same validation, prompt hashing and faults as its
HTTP route), the engine computes it, and its response comes back as the same SSE bytes the HTTP
route streams (``SseStream``'s chunks), fed to the replayer's reader with the loop's clock reading.
So the client's SSE parsing, timing and records are the HTTP path's, less the network.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Callable, Mapping, Sequence

from aiohttp import web
from kv_cache_tester.replay.http import Body, Exchanger, Reader
from kv_cache_tester.replay.loop import SESSION_HEADERS

from agentsweep.contract.cell import VIRTUAL_ROUTER_POLICIES
from agentsweep.engine_sim.request import FINISHED, SimRequest
from agentsweep.engine_sim.scheduler import Engine
from agentsweep.engine_sim.server import SimServer
from agentsweep.engine_sim.sse import SseStream

Clock = Callable[[], float]
_SEP = b"\0"  # between a header's name and value in a request (``encode_request``)


def encode_request(body: bytes, headers: Mapping[str, str]) -> list[bytes]:
    """A request as an in-process endpoint takes it: the body, then one ``name\\0value`` per header."""
    return [body, *(_SEP.join((name.encode(), value.encode())) for name, value in headers.items())]


def request_headers(request: list[bytes]) -> dict[str, str]:
    """The headers of a request ``encode_request`` made."""
    return dict(line.decode().split(_SEP.decode(), 1) for line in request[1:])


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
        body, headers = request[0], request_headers(request)
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
        return encode_request(body, headers)

    async def connection(self, fresh: bool = False) -> Exchanger:
        return LocalConnection(self._server, self._chat, self._clock)

    def release(self, conn: Exchanger) -> None:
        pass

    def close(self) -> None:
        pass


RING_POINTS = 160  # points per instance on the consistent-hash ring: shares within a few percent


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class RoutedEndpoint:
    """The replayer's endpoint for several ``SimServer`` instances behind a router in this process.

    Each request goes to the instance the cell's router policy picks, then as ``LocalEndpoint`` sends
    it: ``consistent_hash`` keys on the session header the replayer sends (``X-Session-ID``, or
    ``X-SMG-Routing-Key``) over a hash ring, so a session stays on one instance and its prefix in that
    instance's cache; ``round_robin`` takes them in turn; ``random`` draws one (seeded);
    ``power_of_two`` draws two and takes the one with fewer requests running and waiting. ``counts``
    are the requests sent to each instance, as a router's per-worker counter.
    """

    def __init__(
        self, servers: Sequence[SimServer], policy: str, chat: bool, clock: Clock, seed: int = 0
    ) -> None:
        if policy not in VIRTUAL_ROUTER_POLICIES:
            raise ValueError(f"router policy {policy!r} is not one of {', '.join(VIRTUAL_ROUTER_POLICIES)}")
        self._servers = list(servers)
        self._policy = policy
        self._chat = chat
        self._clock = clock
        self._random = random.Random(seed)
        self._turn = 0
        ring = sorted(
            (_hash(f"instance-{i}-{k}"), i) for i in range(len(servers)) for k in range(RING_POINTS)
        )
        self._ring_keys = [h for h, _ in ring]
        self._ring_owner = [i for _, i in ring]
        self.counts = [0] * len(servers)

    def request(self, body: bytes, headers: Mapping[str, str]) -> list[bytes]:
        return encode_request(body, headers)

    def pick(self, headers: Mapping[str, str]) -> int:
        """The instance a request with these headers goes to."""
        n = len(self._servers)
        key = next((headers[h] for h in SESSION_HEADERS if headers.get(h)), None)
        if self._policy == "consistent_hash" and key is not None:
            at = bisect.bisect_left(self._ring_keys, _hash(key))
            return self._ring_owner[at % len(self._ring_owner)]
        if self._policy == "random":
            return self._random.randrange(n)
        if self._policy == "power_of_two" and n > 1:
            a, b = self._random.sample(range(n), 2)
            load = [s.engine.num_running + s.engine.num_waiting for s in self._servers]
            return a if load[a] <= load[b] else b
        self._turn = (self._turn + 1) % n  # round_robin, and a request without a session key
        return (self._turn - 1) % n

    async def connection(self, fresh: bool = False) -> Exchanger:
        return _RoutedConnection(self)

    def exchange_with(self, index: int) -> LocalConnection:
        self.counts[index] += 1
        return LocalConnection(self._servers[index], self._chat, self._clock)

    def release(self, conn: Exchanger) -> None:
        pass

    def close(self) -> None:
        pass


class _RoutedConnection:
    """One request's exchange through the in-process router."""

    reused = False

    def __init__(self, endpoint: RoutedEndpoint) -> None:
        self._endpoint = endpoint

    async def exchange(self, request: list[bytes], reader: Reader) -> None:
        endpoint = self._endpoint
        await endpoint.exchange_with(endpoint.pick(request_headers(request))).exchange(request, reader)
