"""Fault injection for reliability tests of the launcher, replayer and cell runner.

Requests are the completion requests the server receives (chat or text), numbered from 1:

* ``fail_rate`` p: each request answers HTTP 500 with probability p (seeded).
* ``fail_after`` N: requests after the N-th answer HTTP 500.
* ``stall_after`` N: responses to requests after the N-th stop mid-way (half of the tokens sent,
  then nothing, connection held open) until the client gives up; the request is frozen (no more
  tokens computed) and counts as running, as on a hung engine.
* ``crash_after`` N: the request after the N-th makes the process exit at once (status 1).
* ``slow_start`` S: /health (and every API route) answers 503 for S wall-clock seconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

FAIL, STALL, CRASH = "fail", "stall", "crash"


@dataclass(slots=True)
class Faults:
    fail_rate: float = 0.0
    fail_after: int | None = None
    stall_after: int | None = None
    crash_after: int | None = None
    slow_start: float = 0.0
    seed: int = 0
    count: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"faults:{self.seed}")

    def next_request(self) -> str | None:
        """Number the next request and say which fault, if any, it meets."""
        self.count += 1
        n = self.count
        if self.crash_after is not None and n > self.crash_after:
            return CRASH
        if self.fail_after is not None and n > self.fail_after:
            return FAIL
        if self.fail_rate and self._rng.random() < self.fail_rate:
            return FAIL
        if self.stall_after is not None and n > self.stall_after:
            return STALL
        return None
