"""A test that leaves the test process's signal handling changed fails, and the handling is put back.

A handler left behind changes every later test in the same worker, and an ignored SIGINT, SIGTERM or
SIGHUP is inherited by every process a later test starts: a child whose SIGINT is ignored never sees
Ctrl-C (Python installs no KeyboardInterrupt handler for a signal ignored at start-up), so a test of
how a command stops on a signal fails far from the test that caused it, and only in some orders.
"""

from __future__ import annotations

import signal
from collections.abc import Generator
from typing import Any

import pytest

WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _name(handler: Any) -> str:
    if handler is signal.SIG_IGN:
        return "ignored"
    if handler is signal.SIG_DFL:
        return "default"
    return getattr(handler, "__qualname__", repr(handler))


class SignalGuard:
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        before = {sig: signal.getsignal(sig) for sig in WATCHED}
        try:
            return (yield)
        finally:
            changed = []
            for sig, handler in before.items():
                now = signal.getsignal(sig)
                if now is not handler:
                    changed.append(f"{signal.Signals(sig).name} {_name(handler)} -> {_name(now)}")
                    signal.signal(sig, handler)
            if changed:
                pytest.fail(f"the test left this process's signal handling changed: {', '.join(changed)}")
