"""A loopback HTTP server that answers every GET with the next of the replies a test gave it (the last
one again once they run out): a /metrics endpoint whose text a test scripts read by read."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Reply = str | tuple[int, str]  # a body (status 200), or (status, body)


class CannedServer:
    """The replies to serve, in order, and how many GETs it has answered (``served``)."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self.replies: list[tuple[int, str]] = [(200, "")]
        self.served = 0

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve(self, replies: Sequence[Reply]) -> None:
        """Answer the next GETs with ``replies`` (counting from 0 again)."""
        with self._lock:
            self.replies = [r if isinstance(r, tuple) else (200, r) for r in replies] or [(200, "")]
            self.served = 0

    def next_reply(self) -> tuple[int, str]:
        with self._lock:
            reply = self.replies[min(self.served, len(self.replies) - 1)]
            self.served += 1
            return reply


@contextmanager
def canned_server() -> Iterator[CannedServer]:
    """A started CannedServer on a free loopback port, shut down on exit."""
    canned: CannedServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, text = canned.next_reply()
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")  # Prometheus text
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    canned = CannedServer(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield canned
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
