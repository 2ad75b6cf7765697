"""`agentsweep dashboard [--db URL] -o DIR [--serve [--port N]]`: write the store's dashboard.

DIR then opens from file:// (open DIR/index.html) with no network; ``--serve`` also serves it on
127.0.0.1 until interrupted.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import signal
import sys
from pathlib import Path
from types import FrameType

from agentsweep.dashboard.build import build
from agentsweep.errors import InputError
from agentsweep.store.cli import add_db
from agentsweep.store.db import Store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        "--out",
        dest="out",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder to write the site to",
    )
    parser.add_argument("--serve", action="store_true", help="serve DIR on 127.0.0.1 after writing it")
    parser.add_argument(
        "--port", type=_port, default=8050, help="port for --serve (default 8050; 0: any free one)"
    )
    add_db(parser)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0..65535; 0: any free one)")
    return port


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def listen(out: Path, port: int) -> http.server.ThreadingHTTPServer:
    """The server of ``out`` bound to 127.0.0.1:``port`` (bound before the site is built, so a port
    in use is one line and nothing is written)."""
    handler = functools.partial(_Quiet, directory=str(out))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as err:  # in use, or not ours to bind
        why = (err.strerror or str(err)).lower()
        raise InputError(f"--port {port}: cannot serve on 127.0.0.1:{port}: {why}") from None


def serve(server: http.server.ThreadingHTTPServer, out: Path) -> None:
    with server:

        def stop(_sig: int, _frame: FrameType | None) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, stop)
        host, bound = server.server_address[:2]
        print(
            f"dashboard: serving {out} at http://{host!s}:{bound}/ (Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            print("dashboard: stopped", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    server = listen(args.out, args.port) if args.serve else None
    try:
        store = Store.open(args.db)
        try:
            counts = build(store, args.out)
        finally:
            store.dispose()
    except BaseException:
        if server is not None:
            server.server_close()
        raise
    print(
        f"dashboard: {counts['points']} points of {counts['runs']} runs -> {args.out / 'index.html'}",
        file=sys.stderr,
    )
    if server is not None:
        serve(server, args.out)
    return 0
