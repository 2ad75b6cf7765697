"""requests.jsonl writer (one line per finished request, appended and on disk at once) + live counters.

Each line goes out with a single ``os.write`` on an ``O_APPEND`` descriptor: no user-space buffer
to lose on SIGTERM or a crash, and several worker processes can share the file without
interleaving lines.
"""

from __future__ import annotations

import os
from pathlib import Path

from kv_cache_tester.replay.jsonfast import dumps
from kv_cache_tester.replay.results import REQUESTS_FILE, RequestRecord
from kv_cache_tester.stats import LogHistogram, percentile

DEBUG_FILE = "debug_trace.jsonl"


def open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


class Recorder:
    def __init__(self, out_dir: Path, debug: bool = False) -> None:
        self._fd = open_append(out_dir / REQUESTS_FILE)
        self._debug_fd = open_append(out_dir / DEBUG_FILE) if debug else None
        self.itl_hist = LogHistogram()
        # live counters for the progress line (cumulative)
        self.done = 0
        self.ok = 0
        self.failed = 0
        self.in_tokens = 0
        self.out_tokens = 0
        self._recent_ttft: list[float] = []

    def write(self, rec: RequestRecord, itls: list[float] | None) -> None:
        os.write(self._fd, dumps(rec) + b"\n")
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
        os.write(self._debug_fd, b"".join(lines))

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
