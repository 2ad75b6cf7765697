"""requests.jsonl writer (one line per finished request, appended and on disk at once) + live counters.

Each line goes out with a single ``os.write`` on an ``O_APPEND`` descriptor: no user-space buffer
to lose on SIGTERM or a crash, and several worker processes can share the file without
interleaving lines. A line the disk has no room for is taken back out (the file keeps whole
lines only) and the write raises WriteFailed naming the file: the lane stops the run with that line.
"""

from __future__ import annotations

import os
from pathlib import Path

from kv_cache_tester.errors import WriteFailed
from kv_cache_tester.replay.jsonfast import dumps
from kv_cache_tester.replay.results import REQUESTS_FILE, RequestRecord
from kv_cache_tester.stats import LogHistogram, percentile

DEBUG_FILE = "debug_trace.jsonl"


def open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def append_whole(fd: int, data: bytes, path: Path) -> None:
    """``data`` appended in full, or not at all: a short write (a full disk) is cut back off the file
    and raises WriteFailed naming ``path``."""
    done = 0
    try:
        while done < len(data):
            done += os.write(fd, data[done:])
    except OSError as err:
        if done:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - done))
        raise WriteFailed(path, err) from None


class Recorder:
    def __init__(self, out_dir: Path, debug: bool = False) -> None:
        self._path = out_dir / REQUESTS_FILE
        self._debug_path = out_dir / DEBUG_FILE
        self._fd = open_append(self._path)
        self._debug_fd = open_append(self._debug_path) if debug else None
        self.itl_hist = LogHistogram()
        # live counters for the progress line (cumulative)
        self.done = 0
        self.ok = 0
        self.failed = 0
        self.in_tokens = 0
        self.out_tokens = 0
        self._recent_ttft: list[float] = []

    def write(self, rec: RequestRecord, itls: list[float] | None) -> None:
        append_whole(self._fd, dumps(rec) + b"\n", self._path)
        self.done += 1
        if rec["status"] == "ok":
            self.ok += 1
            self.out_tokens += rec["output_tokens"] or 0
            self.in_tokens += rec["prompt_tokens"] or 0
            if rec["ttft_s"] is not None and len(self._recent_ttft) < 100_000:
                self._recent_ttft.append(rec["ttft_s"])
            if itls and rec["phase"] == "profile":
                self.itl_hist.add_many(itls)
        else:
            self.failed += 1

    def write_debug(self, request_id: str, chunks: list[tuple[float, bytes]]) -> None:
        if self._debug_fd is None:
            return
        lines = [
            dumps({"request_id": request_id, "t": t, "data": data.decode("utf-8", "replace")}) + b"\n"
            for t, data in chunks
        ]
        append_whole(self._debug_fd, b"".join(lines), self._debug_path)

    def take_recent_ttft_p50(self) -> float | None:
        """p50 TTFT since the previous call (for the progress line), then forget those samples."""
        data = sorted(self._recent_ttft)
        self._recent_ttft = []
        return percentile(data, 50.0)

    def close(self) -> None:
        for fd in (self._fd, self._debug_fd):
            if fd is not None:
                os.close(fd)
        self._debug_fd = None
