"""The terminal progress line: active users, requests done, tokens/s, p50 TTFT, time left.

On a terminal the line is rewritten in place every interval; otherwise (CI logs) a plain line is
printed every ``log_every`` seconds so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    def __init__(
        self,
        users: int,
        duration: float | None,
        *,
        color: bool = True,
        max_ttft: float | None = None,
        stream: TextIO | None = None,
        log_every: float = 10.0,
    ) -> None:
        self.users = users
        self.duration = duration
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.color = color and self.tty
        self.max_ttft = max_ttft
        self.log_every = log_every
        self._last_t: float | None = None
        self._last_tokens = 0
        self._last_done = 0
        self._last_log = 0.0
        self._drawn = False

    def format(self, elapsed: float, snap: dict[str, Any], now: float) -> str:
        dt = (now - self._last_t) if self._last_t is not None else elapsed
        tok_rate = (snap["tokens"] - self._last_tokens) / dt if dt > 0 else 0.0
        req_rate = (snap["done"] - self._last_done) / dt if dt > 0 else 0.0
        self._last_t, self._last_tokens, self._last_done = now, snap["tokens"], snap["done"]
        p50 = snap.get("ttft_p50")
        ttft = f"{p50 * 1000:.0f} ms" if p50 is not None else "-"
        if self.color and p50 is not None and self.max_ttft and p50 > self.max_ttft:
            ttft = f"\x1b[31m{ttft}\x1b[0m"
        left = f"{max(0.0, self.duration - elapsed):.0f}s" if self.duration else "-"
        failed = snap["failed"]
        fail = f" ({failed} failed)" if failed else ""
        if self.color and failed:
            fail = f"\x1b[33m{fail}\x1b[0m"
        return (
            f"[{elapsed:7.1f}s] users {snap['active']}/{self.users} | in flight {snap['in_flight']} | "
            f"done {snap['done']}{fail} | {req_rate:.1f} req/s | {tok_rate / 1000:.1f}k tok/s | "
            f"p50 TTFT {ttft} | left {left}"
        )

    def update(self, elapsed: float, snap: dict[str, Any]) -> None:
        now = time.perf_counter()
        line = self.format(elapsed, snap, now)
        if self.tty:
            self.stream.write("\r\x1b[2K" + line if self.color else "\r" + line.ljust(120))
            self._drawn = True
        elif now - self._last_log >= self.log_every:
            self._last_log = now
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
