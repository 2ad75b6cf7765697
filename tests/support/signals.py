"""A test that leaves the test process's signal handling changed fails, and the handling is put back.

A handler left behind changes every later test in the same worker, and an ignored or blocked SIGINT,
SIGTERM or SIGHUP is inherited by every process a later test starts: a child whose SIGINT is ignored
never sees Ctrl-C (Python installs no KeyboardInterrupt handler for a signal ignored at start-up), so
a test of how a command stops on a signal fails far from the test that caused it, and only in some
orders. Checked around each phase (set-up, call, teardown), fixtures included.
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


def _state() -> tuple[dict[int, Any], set[int]]:
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return {sig: signal.getsignal(sig) for sig in WATCHED}, {sig for sig in WATCHED if sig in blocked}


def _restore(phase: str) -> Generator[None, None, None]:
    handlers, blocked = _state()
    try:
        return (yield)
    finally:
        now_handlers, now_blocked = _state()
        changed = []
        for sig, handler in handlers.items():
            if now_handlers[sig] is not handler:
                changed.append(f"{signal.Signals(sig).name} {_name(handler)} -> {_name(now_handlers[sig])}")
                signal.signal(sig, handler)
        if now_blocked != blocked:
            changed.append(f"blocked {sorted(blocked)} -> {sorted(now_blocked)}")
            signal.pthread_sigmask(
                signal.SIG_SETMASK,
                [s for s in signal.pthread_sigmask(signal.SIG_BLOCK, []) if s not in WATCHED or s in blocked],
            )
        if changed:
            pytest.fail(
                f"the test's {phase} left this process's signal handling changed: {', '.join(changed)}"
            )


def take_back_sigint() -> None:
    """A run started in the background by a shell without job control (``make test &``, a CI step's
    script) starts with SIGINT ignored, and so would every process its tests start, so the tests of how
    a command stops on Ctrl-C would fail. The test process takes Python's own handler back: a process
    it starts then begins with the default (an exec resets a caught signal, never an ignored one)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class SignalGuard:
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from _restore("set-up"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from _restore("call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from _restore("teardown"))
