"""`agentsweep metrics-collector`: scrape /metrics into server_metrics.csv until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlparse

from agentsweep.errors import InputError
from agentsweep.metrics.dialects import DIALECTS
from agentsweep.metrics.scraper import DEFAULT_MAX_FAILURES, Scraper

MAX_SECONDS = 86400.0  # a day: beyond it a wait overflows the platform's timeout, and means nothing


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and value <= MAX_SECONDS):  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be > 0 and at most {MAX_SECONDS:g} seconds, got {text}")
    return value


def _failures(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"must be from 1 to 100000, got {value}")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port (1-65535): {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True, help="metrics URL, e.g. http://127.0.0.1:8000/metrics")
    parser.add_argument("--output", required=True, type=Path, help="CSV to append to (server_metrics.csv)")
    parser.add_argument("--interval", type=_positive, default=1.0, help="seconds between scrapes (default 1)")
    parser.add_argument("--timeout", type=_positive, default=None, help="per-scrape timeout in seconds")
    parser.add_argument(
        "--dialect", choices=DIALECTS, default=None, help="force a dialect instead of detecting it"
    )
    parser.add_argument(
        "--kv-events-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="count the engine's KV-cache events (vLLM --kv-events-config) published to a ZMQ socket "
        "bound on 127.0.0.1:PORT: evicted_tokens_total",
    )
    parser.add_argument(
        "--max-failures",
        type=_failures,
        default=DEFAULT_MAX_FAILURES,
        help=f"give up after this many failed scrapes in a row (default {DEFAULT_MAX_FAILURES})",
    )


def run(args: argparse.Namespace) -> int:
    url = urlparse(args.endpoint)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise InputError(f"--endpoint: not an http(s) URL: {args.endpoint!r}")
    if args.output.exists() and args.output.is_dir():
        raise InputError(f"--output: {args.output} is a directory")
    events = None
    if args.kv_events_port is not None:
        from agentsweep.metrics.kv_events import Listener

        try:
            events = Listener("127.0.0.1", args.kv_events_port)
        except ModuleNotFoundError as err:
            raise InputError(
                f"--kv-events-port: counting vLLM's evicted blocks needs {err.name}: "
                "pip install 'agentsweep[kv-events]'"
            ) from None
        except Exception as err:  # zmq.ZMQError (the port is taken): one line
            raise InputError(f"--kv-events-port {args.kv_events_port}: cannot listen ({err})") from None
    scraper = Scraper(
        args.endpoint,
        args.output,
        args.interval,
        args.timeout,
        args.dialect,
        max_failures=args.max_failures,
        kv_events=events,
    )
    stats = scraper.run_until_signalled()
    if stats.ok == 0:
        print(
            f"metrics-collector: warning: no successful scrape of {args.endpoint}"
            + (f" (last error: {stats.last_error})" if stats.last_error else ""),
            file=sys.stderr,
        )
    return 0
