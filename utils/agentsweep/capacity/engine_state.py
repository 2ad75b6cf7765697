"""Between two search steps: let the engine finish what the last step left in flight, then reset its
prefix cache, so each step starts from a cold cache as a fresh cell would.

Idle is read from the engine's own /metrics (running and waiting requests, in either dialect). The
reset is vLLM's ``POST /reset_prefix_cache`` (served in its development mode) or SGLang's
``POST /flush_cache``; both refuse while requests still hold blocks (vLLM 409, SGLang 400), so a
refusal is retried until the deadline.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from agentsweep.cell.settle import read_metrics
from agentsweep.errors import InputError
from agentsweep.metrics.dialects import map_text

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def in_flight(metrics_url: str, timeout_s: float = 5.0) -> int | None:
    """Running plus waiting requests as the engine reports them; None when it cannot be told."""
    try:
        _dialect, values = map_text(read_metrics(metrics_url, timeout_s))
    except (urllib.error.URLError, OSError, InputError, ValueError):
        return None
    running, waiting = values.get("requests_running"), values.get("requests_waiting")
    if running is None and waiting is None:
        return None
    return int((running or 0) + (waiting or 0))


def wait_idle(metrics_urls: list[str], timeout_s: float, poll_s: float = 0.25) -> str | None:
    """Wait until every engine reports nothing running or waiting; None when idle, else why not."""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = {url: in_flight(url) for url in metrics_urls}
        if all(n == 0 for n in busy.values()):
            return None
        if time.monotonic() >= deadline:
            shown = ", ".join(f"{url}: {'unknown' if n is None else n}" for url, n in busy.items())
            return f"the engine was not idle {timeout_s:g} s after the replay (requests in flight: {shown})"
        time.sleep(poll_s)


def reset_prefix_cache(url: str, timeout_s: float, poll_s: float = 0.5) -> str | None:
    """POST ``url`` (the engine's reset route) until it answers 200; None on success, else why not."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        request = urllib.request.Request(url, data=b"", method="POST")
        try:
            with _NO_PROXY.open(request, timeout=max(1.0, min(30.0, deadline - time.monotonic()))) as resp:
                if resp.status == 200:
                    return None
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}"
            if err.code in (404, 405):  # the route is not served: retrying will not help
                return f"POST {url}: {last} (the engine does not serve a prefix-cache reset)"
        except (urllib.error.URLError, OSError) as err:
            last = str(getattr(err, "reason", err))
        if time.monotonic() >= deadline:
            return f"POST {url}: {last} after {timeout_s:g} s"
        time.sleep(poll_s)
