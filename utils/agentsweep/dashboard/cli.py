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
        "--port", type=int, default=8050, help="port for --serve (default 8050; 0: any free one)"
    )
    add_db(parser)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(out: Path, port: int) -> None:
    handler = functools.partial(_Quiet, directory=str(out))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:

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
    store = Store.open(args.db)
    try:
        counts = build(store, args.out)
    finally:
        store.dispose()
    print(
        f"dashboard: {counts['points']} points of {counts['runs']} runs -> {args.out / 'index.html'}",
        file=sys.stderr,
    )
    if args.serve:
        serve(args.out, args.port)
    return 0
