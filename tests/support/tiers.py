"""The test tiers and their guard.

A test with none of the tier markers is a unit test: it runs in `make test-fast` and must not start a
process or open a socket. While such a test sets up and runs, every way to do either (subprocess and
asyncio subprocesses, os.fork/posix_spawn/system, multiprocessing, socket bind/connect, which aiohttp
servers and clients, urllib and asyncio streams go through) fails it with a line saying which marker
it needs. Teardown is not guarded: a shared fixture may stop its processes after any test.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# The markers that let a test start processes or open sockets (declared in pyproject.toml).
TIER_MARKERS = ("integration", "slow", "slurm", "chromium", "engine_parsers")

# (owner, attribute, what calling it does): every door to a new process or a network socket.
_DOORS: tuple[tuple[Any, str, str], ...] = (
    (subprocess.Popen, "_execute_child", "starts a process"),
    (os, "fork", "forks"),
    (os, "forkpty", "forks"),
    (os, "posix_spawn", "starts a process"),
    (os, "posix_spawnp", "starts a process"),
    (os, "system", "starts a process"),
    (multiprocessing.process.BaseProcess, "start", "starts a process"),
    (socket.socket, "bind", "binds a socket"),
    (socket.socket, "connect", "connects a socket"),
    (socket.socket, "connect_ex", "connects a socket"),
)


class UnmarkedTierError(pytest.fail.Exception):  # type: ignore[name-defined,misc]
    """A BaseException, so the code under test cannot catch it as an ordinary error."""


def tier_of(item: pytest.Item) -> str | None:
    """The first tier marker on ``item``, or None for a unit test."""
    names = {mark.name for mark in item.iter_markers()}
    return next((name for name in TIER_MARKERS if name in names), None)


@contextlib.contextmanager
def no_processes_or_sockets(nodeid: str) -> Iterator[list[str]]:
    """While inside, each door above raises UnmarkedTierError naming ``nodeid``; yields the list of
    what was refused (filled even when the code under test swallowed the error, e.g. in a thread)."""
    refused: list[str] = []

    def closed(what: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            detail = f"{nodeid} {what} ({original.__qualname__}) but has no tier marker"
            refused.append(detail)
            raise UnmarkedTierError(
                f"{detail}: mark it @pytest.mark.integration (quick) or slow, slurm or chromium "
                "(see 'Tests' in README.md)"
            )

        return refuse

    with pytest.MonkeyPatch.context() as patch:
        for owner, name, what in _DOORS:
            original = getattr(owner, name, None)
            if original is not None:
                patch.setattr(owner, name, closed(what, original))
        yield refused


@contextlib.contextmanager
def guarded(item: pytest.Item) -> Iterator[None]:
    """Guard a unit test's setup or call phase; a marked test runs as is."""
    if tier_of(item) is not None:
        yield
        return
    with no_processes_or_sockets(item.nodeid) as refused:
        yield
    if refused:  # refused, and the error swallowed on the way (a thread, a broad except)
        raise UnmarkedTierError(refused[0], pytrace=False)
