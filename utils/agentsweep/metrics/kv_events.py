"""vLLM's KV-cache events, counted: the blocks it stored in and evicted from its prefix cache.

vLLM reports no eviction counter on /metrics. With ``--kv-events-config`` it publishes every change of
its prefix cache on a ZMQ PUB socket instead: each message is three frames (topic, an 8-byte big-endian
sequence number counted from 0 per publisher, a msgpack payload). The payload is an event batch, the
array ``[ts, events, data_parallel_rank]``; each event a map tagged by ``type``: ``BlockStored`` (with
``block_hashes``, ``block_size`` and ``medium``), ``BlockRemoved`` (``block_hashes``, ``medium``) and
``AllBlocksCleared``. A ``BlockRemoved`` is sent when a cached block's content goes: when the pool
hands the block out for new content.

A count is whole only when every message from the publisher's first (sequence 0) arrived and decoded:
``missing`` counts the sequence numbers that never arrived (a publisher drops what it cannot send, a
subscriber that joins late misses the first ones), a restarted publisher (its sequence back at 0) is
counted in ``restarts``. A listener whose count is not whole, or whose publisher restarted, gives no
eviction figure, never a part.

Used by the cell's scraper (``metrics-collector --kv-events-port``: the engine's publisher connects to
the port the cell's plan allocated) and by scripts/vllm_cpu/kv_events.py (the KV-pressure comparison).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

GPU_MEDIA = (None, "GPU")  # a publisher without tiers leaves the medium out
POLL_MS = 200


@dataclass
class Counts:
    batches: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    missing: int = 0
    restarts: int = 0
    undecodable: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0  # from the GPU pool
    removed_other_blocks: int = 0  # from another medium (an offload tier)
    cleared: int = 0
    block_size: int | None = None  # tokens per block, as BlockStored events state it
    block_sizes: int = 0  # distinct block sizes seen

    def whole(self) -> bool:
        """Every message since the publisher's first arrived and decoded."""
        return self.first_seq == 0 and self.missing == 0 and self.undecodable == 0

    def take(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.undecodable += 1
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if self.last_seq is None:
            self.first_seq = seq
        elif seq <= self.last_seq:
            self.restarts += 1
            self.missing += seq  # the new publisher's messages before this one
        else:
            self.missing += seq - self.last_seq - 1
        self.last_seq = seq
        import msgspec

        try:
            batch = msgspec.msgpack.decode(frames[2])
            for event in batch[1]:
                self._event(event)
        except (msgspec.DecodeError, TypeError, IndexError, KeyError, ValueError):
            self.undecodable += 1
            return
        self.batches += 1

    def _event(self, event: Any) -> None:
        kind = event["type"]
        if kind == "BlockStored":
            self.stored_blocks += len(event["block_hashes"])
            size = event.get("block_size")
            if isinstance(size, int) and size > 0 and size != self.block_size:
                self.block_sizes += 1
                self.block_size = size
        elif kind == "BlockRemoved":
            n = len(event["block_hashes"])
            if event.get("medium") in GPU_MEDIA:
                self.removed_blocks += n
            else:
                self.removed_other_blocks += n
        elif kind == "AllBlocksCleared":
            self.cleared += 1
        else:
            raise ValueError(kind)

    def evicted_tokens(self) -> tuple[float | None, str]:
        """Tokens of the GPU blocks evicted so far, or None with why the count cannot be given."""
        if self.first_seq is None and not self.undecodable:
            return 0.0, ""  # nothing published yet: nothing evicted
        if not self.whole() or self.restarts:
            lost = []
            if self.first_seq not in (None, 0):
                lost.append(f"the first {self.first_seq} messages")
            if self.missing:
                lost.append(f"{self.missing} messages")
            if self.restarts:
                lost.append(f"{self.restarts} publisher restarts")
            if self.undecodable:
                lost.append(f"{self.undecodable} undecodable messages")
            return None, f"the KV-event listener lost events ({', '.join(lost)}): no partial count"
        if self.block_sizes > 1:
            return None, "the engine's blocks have several sizes: evicted blocks are not tokens"
        if self.removed_blocks and self.block_size is None:
            return None, "no BlockStored event stated the block size"
        return float(self.removed_blocks * (self.block_size or 0)), ""


def drain(sock: Any, counts: Counts) -> None:
    """Count every message waiting on ``sock``."""
    import zmq

    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        counts.take(frames)


class Listener:
    """A SUB socket bound on ``host:port`` (the engine's publisher connects to it), counting in a
    thread from ``start`` to ``stop``; ``snapshot`` reads the counts so far."""

    def __init__(self, host: str, port: int) -> None:
        import zmq

        self.endpoint = f"tcp://{host}:{port}"
        self._context = zmq.Context()
        self._sock = self._context.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.RCVHWM, 0)  # keep everything: the count must be whole
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.endpoint)
        self._counts = Counts()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(POLL_MS):
                with self._lock:
                    drain(self._sock, self._counts)

    def snapshot(self) -> Counts:
        with self._lock:
            return Counts(**vars(self._counts))

    def stop(self) -> Counts:
        """Stop listening (what already arrived is counted) and close the socket."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._lock:
            drain(self._sock, self._counts)
        self._context.destroy(linger=0)
        return self.snapshot()
