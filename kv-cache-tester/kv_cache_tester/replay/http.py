"""HTTP/1.1 for the replay: keep-alive connections to one server, one streaming POST at a time each.

A replay spends most of its time on the way a response's bytes take to its reader, once per token
of every stream; a general client (aiohttp) pays there a stream object, a future and several calls
per chunk, and adds the time a chunk waits in the event loop to the token's. Here each connection is
an asyncio protocol that decodes the response as the socket is read and hands each read's body bytes,
with the clock reading taken as they arrived, straight to the request's ``Reader``; the request's
coroutine is woken once, when the response has ended. The request (head and body) goes out with one
write inside ``Connection.exchange``, so it has left before the coroutine first waits.

What a response may be: any status, ``Transfer-Encoding: chunked``, a ``Content-Length`` or a body
that ends when the server closes the connection; interim (1xx) responses are skipped. A connection is
kept for the next request only when its response ended by its own framing, the server did not ask to
close it, and the whole request had been written.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from itertools import repeat
from typing import Protocol, cast
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 << 10  # a response head longer than this is not an HTTP server's
MAX_CHUNK_LINE = 1024  # a chunk-size line longer than this neither
WHOLE_CHUNKS_FROM = 512  # bytes: a read this long is most likely several chunks (see _whole_chunks)
KEEPALIVE_S = 15.0  # an idle connection older than this is closed rather than reused
_STALE_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})

Clock = Callable[[], float]


class HttpError(Exception):
    """A request the network or the server did not carry through."""


class ConnectError(HttpError):
    """No connection could be opened to the server."""


class Disconnected(HttpError):
    """The connection closed (or was reset) before the response ended.

    ``responded``: some bytes of the response had come. ``stale``: the way a keep-alive connection
    that the server closed while it was idle fails (end of stream, or a reset or broken pipe).
    """

    def __init__(self, message: str, *, responded: bool, stale: bool) -> None:
        super().__init__(message)
        self.responded = responded
        self.stale = stale


class BadResponse(HttpError):
    """The server's bytes are not an HTTP/1.1 response."""


Body = Callable[[bytes, float], bool]  # what takes a response's body: see Reader.head


class Reader(Protocol):
    """Where a response goes, as it arrives."""

    def head(self, status: int, headers: Mapping[str, str]) -> Body:
        """The final response's status and headers (names in lower case). Returns what takes its
        body: called with the body bytes of each read and the clock reading taken when they arrived;
        it returns False to read no further (the connection is closed, the exchange ends normally)."""


class Exchanger(Protocol):
    """A connection as a request sees it (``Connection``, or an in-process engine's stand-in)."""

    reused: bool

    async def exchange(self, request: list[bytes], reader: Reader) -> None:
        """Send ``request`` and feed its response to ``reader`` until the response ends."""


class RequestEndpoint(Protocol):
    """Where the replayer's requests go: ``Endpoint`` (HTTP/1.1), or an engine in this process."""

    def request(self, body: bytes, headers: Mapping[str, str]) -> list[bytes]:
        """The request's bytes: its head and ``body``."""

    async def connection(self, fresh: bool = False) -> Exchanger:
        """A connection to send one request on (``fresh``: a new one, closed after it)."""

    def release(self, conn: Exchanger) -> None:
        """Take ``conn`` back after its request."""

    def close(self) -> None:
        """Close every connection."""


class Connection(asyncio.Protocol):
    """One connection; ``exchange`` sends a request and feeds its response to a ``Reader``."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._transport: asyncio.Transport | None = None
        self._reader: Reader | None = None
        self._body: Body | None = None
        self._done: asyncio.Future[None] | None = None
        self._buf = bytearray()  # bytes not decoded yet (a head, a chunk-size line)
        self._got = 0  # bytes of the current response received
        self._in_head = True
        self._chunked = False
        self._left = -1  # bytes left of the current chunk or of a Content-Length body; -1: until close
        self._crlf = False  # a chunk's data is read; its CRLF is next
        self._trailer = False  # the last chunk is read; trailer lines until an empty one
        self._keep = False  # the response allows the connection to be used again
        self.closed = False
        self.reused = False  # handed out from the pool (it served a request before)
        self.pooled = True  # may go back to the pool after its request
        self.idle_since = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # a request's head and body leave at once
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        done = self._done
        if done is None or done.done():
            return
        if not self._in_head and self._left == -1 and not self._chunked and exc is None:
            self._finish()  # a body delimited by the end of the connection
            return
        if exc is None:
            what, stale = "the server closed the connection", True
        else:
            what = f"the connection failed: {type(exc).__name__}: {exc}"
            stale = isinstance(exc, OSError) and exc.errno in _STALE_ERRNOS
        where = "before the response" if not self._got else "before the response ended"
        done.set_exception(Disconnected(f"{what} {where}", responded=self._got > 0, stale=stale))

    def eof_received(self) -> bool | None:
        return None  # close; connection_lost says what that meant

    def data_received(self, data: bytes) -> None:
        now = self._clock()
        done = self._done
        if done is None or done.done():  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        self._got += len(data)
        try:
            if self._in_head:
                body = self._head(data)
                if body is None:
                    return
                data = body
            if self._chunked:
                data, end = self._dechunk(data)
            elif self._left >= 0:
                if len(data) > self._left:
                    raise BadResponse("more bytes than the response's Content-Length")
                self._left -= len(data)
                end = self._left == 0
            else:
                end = False
            take = self._body
            if data and take is not None and not take(data, now):
                self.close()
                done.set_result(None)
                return
            if end:
                self._finish()
        except Exception as exc:  # a bad response, or the reader's own failure: the request's
            self.close()
            done.set_exception(exc)

    # -- the exchange ----------------------------------------------------------------------------
    async def exchange(self, request: list[bytes], reader: Reader) -> None:
        """Write ``request`` (its parts, in order) and feed the response to ``reader`` until it ends.
        Raises Disconnected, BadResponse, or what the reader raised; on any of them, and when
        cancelled, the connection is closed."""
        transport = self._transport
        if transport is None or self.closed or transport.is_closing():
            raise Disconnected("the connection was already closed", responded=False, stale=True)
        done = asyncio.get_running_loop().create_future()
        self._done, self._reader, self._body = done, reader, None
        self._got, self._in_head, self._chunked, self._left = 0, True, False, -1
        self._crlf = self._trailer = self._keep = False
        self._buf.clear()
        try:
            transport.writelines(request)
            await done
        except BaseException:
            self.close()
            raise
        finally:
            self._done = self._reader = self._body = None
        if self._keep and transport.get_write_buffer_size():
            self._keep = False  # answered before the request was all written

    @property
    def reusable(self) -> bool:
        return self._keep and not self.closed

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def _finish(self) -> None:
        if self._buf or self._trailer:
            self._keep = False  # bytes after the response (or a cut trailer): start afresh
        assert self._done is not None
        self._done.set_result(None)

    def _head(self, data: bytes) -> bytes | None:
        """Take the response head from the bytes read; what follows it, or None while it is
        incomplete. Interim (1xx) responses are skipped."""
        buf = self._buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise BadResponse(f"no end of the response head in {len(buf)} bytes")
                return None
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            del buf[: end + 4]
            status = _status(lines[0])
            if 100 <= status < 200:
                continue
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep or not name or name != name.strip():
                    raise BadResponse(f"a malformed header line: {line[:100]!r}")
                key = name.lower()
                value = value.strip()
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
            self._frame(status, headers, lines[0])
            if self._reader is not None:
                self._body = self._reader.head(status, headers)
            self._in_head = False
            if self._left == 0 and not self._chunked:  # no body: what follows is not this response's
                self._finish()
                return None
            rest = bytes(buf)
            buf.clear()
            return rest

    def _frame(self, status: int, headers: dict[str, str], status_line: str) -> None:
        """How the body ends, and whether the connection may be used again."""
        http11 = status_line.startswith("HTTP/1.1")
        connection = headers.get("connection", "").lower()
        self._keep = "close" not in connection if http11 else "keep-alive" in connection
        coding = headers.get("transfer-encoding", "").lower()
        if status in (204, 304):
            self._left = 0
        elif coding:
            if coding.rsplit(",", 1)[-1].strip() != "chunked":
                raise BadResponse(f"a body in an unknown transfer coding {coding!r}")
            self._chunked = True
            self._left = 0
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise BadResponse(f"a bad Content-Length {length[:40]!r}")
            self._left = int(length)
        else:
            self._left = -1  # until the server closes the connection
            self._keep = False

    def _dechunk(self, data: bytes) -> tuple[bytes, bool]:
        """The chunked body's data in ``data`` (with what was left from the last read), and
        whether the body has ended."""
        buf = self._buf
        if buf:
            buf += data
            data = bytes(buf)
            buf.clear()
        left, crlf, trailer = self._left, self._crlf, self._trailer
        if len(data) >= WHOLE_CHUNKS_FROM and not (left or crlf or trailer):
            whole = _whole_chunks(data)
            if whole is not None:
                return whole
        out: list[bytes] = []
        pos, n = 0, len(data)
        while pos < n:
            if left:  # inside a chunk's data
                end = pos + left
                if end > n:
                    out.append(data[pos:] if pos else data)
                    left = end - n
                    pos = n
                    break
                out.append(data[pos:end])
                pos, left, crlf = end, 0, True
            if crlf:
                if n - pos < 2:
                    break
                if data[pos] != 13 or data[pos + 1] != 10:
                    raise BadResponse("a chunk that does not end with CRLF")
                pos += 2
                crlf = False
                continue
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > MAX_CHUNK_LINE:
                    raise BadResponse("a chunk-size line without its end")
                break
            line = data[pos:eol]
            pos = eol + 2
            if trailer:
                if not line:  # the empty line after the trailers: the body has ended
                    self._left, self._crlf, self._trailer = 0, False, False
                    buf += data[pos:]
                    return b"".join(out), True
                continue
            size = int(line, 16) if line and not line.translate(None, _HEX) else _chunk_size(line)
            if size:
                left = size
            else:
                trailer = True
        self._left, self._crlf, self._trailer = left, crlf, trailer
        if pos < n:
            buf += data[pos:]
        return (out[0] if len(out) == 1 else b"".join(out)), False


def _whole_chunks(data: bytes) -> tuple[bytes, bool] | None:
    """A read that is whole chunks, maybe ending with the last chunk (the usual read: a streaming
    server writes an event per chunk), decoded with one split and checks in C: (data, ended).
    None for anything else, which the general decoder takes. Sound: pieces between line ends whose
    lengths are their sizes are the chunks that decoding from the start would find."""
    parts = data.split(b"\r\n")
    count = len(parts)
    if not count % 2 or parts[-1]:  # not ending at a chunk's end
        return None
    ended = count >= 3 and parts[-3] == b"0" and not parts[-2]
    del parts[-3 if ended else -1 :]
    sizes, pieces = parts[0::2], parts[1::2]
    lengths = list(map(len, pieces))
    if (
        not all(sizes)
        or b"".join(sizes).translate(None, _HEX)
        or list(map(int, sizes, repeat(16))) != lengths
        or 0 in lengths  # a last chunk before the end of the read
    ):
        return None
    return (pieces[0] if len(pieces) == 1 else b"".join(pieces)), ended


def _status(line: str) -> int:
    parts = line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise BadResponse(f"not an HTTP/1.x status line: {line[:100]!r}")
    return int(parts[1])


_HEX = b"0123456789abcdefABCDEF"


def _chunk_size(line: bytes) -> int:
    """A chunk-size line with extensions or spaces, or a bad one."""
    size = line.split(b";", 1)[0].strip(b" \t")
    if not size or size.translate(None, _HEX):
        raise BadResponse(f"a bad chunk-size line {line[:40]!r}")
    return int(size, 16)


class Endpoint:
    """Keep-alive connections to the server of one URL (http or https), and the request head for it.

    ``connection()`` hands out the most recently used idle connection (or opens one); ``release``
    takes it back when its response allows; ``fresh=True`` opens a connection that is closed after
    its request.
    """

    connection_class = Connection  # what a new connection is (tests put a slower one here)

    def __init__(
        self, url: str, *, clock: Clock = time.perf_counter, keepalive_s: float = KEEPALIVE_S
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.clock = clock
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self._keepalive_s = keepalive_s
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        netloc = parts.netloc.rpartition("@")[2]
        self._head = (
            f"POST {path} HTTP/1.1\r\nHost: {netloc}\r\nContent-Type: application/json\r\n"
            "Accept: text/event-stream\r\n"
        ).encode()

    def request(self, body: bytes, headers: Mapping[str, str]) -> list[bytes]:
        """The request's bytes: its head and ``body`` (not copied)."""
        lines = [self._head, b"Content-Length: %d\r\n" % len(body)]
        for name, value in headers.items():
            line = f"{name}: {value}\r\n"
            if "\r" in line[:-2] or "\n" in line[:-2]:
                raise ValueError(f"a line break in the request header {name}: {value!r}")
            lines.append(line.encode())
        lines.append(b"\r\n")
        return [b"".join(lines), body]

    async def connection(self, fresh: bool = False) -> Connection:
        idle = self._idle
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed and self.clock() - conn.idle_since < self._keepalive_s:
                conn.reused = True
                return conn
            conn.close()
            self._open.discard(conn)
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                lambda: self.connection_class(self.clock), self.host, self.port, ssl=self._ssl
            )
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        conn.pooled = not fresh
        self._open.add(conn)
        return conn

    def release(self, conn: Exchanger) -> None:
        """Take ``conn`` back after its request; it is closed unless it can serve another."""
        assert isinstance(conn, Connection), "a connection this endpoint opened"
        if conn.reusable and conn.pooled:
            conn.idle_since = self.clock()
            self._idle.append(conn)
        else:
            conn.close()
            self._open.discard(conn)

    def close(self) -> None:
        for conn in self._open:
            conn.close()
        self._open.clear()
        self._idle.clear()
