"""Shared fixtures of the replayer's tests, and the guard that keeps its test tiers honest.

Tiers: an unmarked test is a unit test and may neither start a process nor open a network socket;
a test that does either is marked ``integration`` (real servers and replays on loopback, seconds)
or ``slow``. ``pytest -m "not integration and not slow"`` runs the unit tier alone. The guard
catches ``subprocess`` (which ``asyncio`` subprocesses use too) and IPv4/IPv6 sockets created
through the ``socket`` module (every ``asyncio`` server and client); Unix socket pairs, which every
event loop opens for itself, are allowed.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SAMPLE_TRACES = Path(__file__).resolve().parent.parent / "sample_traces"
TIER_MARKERS = ("integration", "slow")


@pytest.fixture
def sample_traces() -> Path:
    return SAMPLE_TRACES


class UnmarkedIO(Exception):
    """An unmarked (unit) test started a process or opened a network socket."""


@pytest.fixture(autouse=True)
def _unit_tests_start_nothing(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    if any(request.node.get_closest_marker(name) for name in TIER_MARKERS):
        yield
        return
    seen: list[str] = []

    def refuse(what: str) -> UnmarkedIO:
        seen.append(what)
        return UnmarkedIO(f"{what} in a test not marked {' or '.join(TIER_MARKERS)}")

    def popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        raise refuse(f"started a process ({args!r:.80})")

    real_socket_init = socket.socket.__init__

    def open_socket(self: socket.socket, family: int = -1, *rest: Any, **kwargs: Any) -> None:
        fileno = kwargs.get("fileno", rest[2] if len(rest) > 2 else None)
        if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
            raise refuse("opened a network socket")
        real_socket_init(self, family, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    monkeypatch.setattr(socket.socket, "__init__", open_socket)
    yield
    if seen:  # also when the code under test caught the exception
        pytest.fail(
            f"{seen[0]}: mark the test {' or '.join(TIER_MARKERS)} (kv-cache-tester/tests/conftest.py)"
        )
