"""Reads of a server's /metrics taken once its counts stop moving, before the collectors' last scrape.

When the replay ends, the client has seen its last request finish, but the server may not have
counted it yet: an engine bumps its finished-request counter after the last chunk is on its way, and
a router renders its counters one at a time. A scrape taken then is torn (the client saw 61 requests
finish, the engine's last row said 60). So after the replay, the cell reads every engine instance's
counts, and the router's, SETTLE_INTERVAL_S apart until two reads give the same figures (for at most
SETTLE_TIMEOUT_S) and only then asks the collectors for their last scrape.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Hashable
from typing import TypeVar

from agentsweep.cell.plan import CellPlan
from agentsweep.errors import InputError
from agentsweep.metrics.dialects import map_text

SETTLE_INTERVAL_S = 0.25
SETTLE_TIMEOUT_S = 10.0
METRICS_MAX_BYTES = 32 << 20
# The engines and the router answer on the cell's own hosts: never through a proxy the environment names.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# The engine figures that must stand still: every counter, and the requests still in the engine.
_MOVING_WHILE_BUSY = ("requests_running", "requests_waiting")

T = TypeVar("T")


def read_metrics(url: str, timeout_s: float = 5.0) -> str:
    """One /metrics read of an engine or the router (at most METRICS_MAX_BYTES, never through a proxy);
    urllib's errors and OSError pass through."""
    with _NO_PROXY.open(url, timeout=timeout_s) as resp:
        data: bytes = resp.read(METRICS_MAX_BYTES)
    return data.decode("utf-8", "replace")


def settle(
    read: Callable[[], T],
    figures: Callable[[T], Hashable],
    timeout_s: float = SETTLE_TIMEOUT_S,
    interval_s: float = SETTLE_INTERVAL_S,
) -> tuple[T, bool]:
    """``read()`` every ``interval_s`` until two reads in a row have the same ``figures``; the last
    read, and whether it settled (False: the figures still moved when ``timeout_s`` ran out)."""
    deadline = time.monotonic() + timeout_s
    last: Hashable | None = None
    while True:
        value = read()
        now = figures(value)
        if now == last:
            return value, True
        if time.monotonic() >= deadline:
            return value, False
        last = now
        time.sleep(interval_s)


def engine_counts(text: str) -> tuple[tuple[str, float | None], ...] | None:
    """The figures of one engine's /metrics text that stop moving once it is idle (its counters and
    its running and waiting requests); None for text that is not a vLLM or SGLang exposition."""
    try:
        _dialect, values = map_text(text)
    except (InputError, ValueError):
        return None
    return tuple(
        (name, value)
        for name, value in sorted(values.items())
        if name.endswith("_total") or name in _MOVING_WHILE_BUSY
    )


def settle_instance_counts(
    plan: CellPlan, timeout_s: float = SETTLE_TIMEOUT_S, interval_s: float = SETTLE_INTERVAL_S
) -> bool:
    """Wait until every engine instance of ``plan`` has counted what it served (its counts read the
    same twice in a row); False when they still moved after ``timeout_s``. An instance that does not
    answer is left out: its collector's log and the checks say what became of it."""
    urls = [inst.url + inst.engine.metrics_path for inst in plan.instances]

    def read() -> tuple[object, ...]:
        out: list[object] = []
        for url in urls:
            try:
                out.append(engine_counts(read_metrics(url)))
            except (urllib.error.URLError, OSError, TimeoutError):
                out.append(None)
        return tuple(out)

    _counts, settled = settle(read, lambda counts: counts, timeout_s, interval_s)
    return settled
