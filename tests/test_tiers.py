"""The tier guard: a unit test cannot start a process or open a socket; a marked test can."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from tests.support.tiers import TIER_MARKERS, UnmarkedTierError, guarded, no_processes_or_sockets

REPO = Path(__file__).resolve().parent.parent


async def _asyncio_subprocess() -> None:
    await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")


async def _aiohttp_server() -> None:
    runner = web.AppRunner(web.Application())
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
    finally:
        await runner.cleanup()


def _bind() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))


def _connect() -> None:
    with socket.socket() as sock:
        sock.connect(("127.0.0.1", 9))


DOORS: dict[str, Callable[[], object]] = {
    "subprocess": lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
    "asyncio subprocess": lambda: asyncio.run(_asyncio_subprocess()),
    "os.system": lambda: os.system("true"),
    "multiprocessing": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "socket bind": _bind,
    "socket connect": _connect,
    "aiohttp server": lambda: asyncio.run(_aiohttp_server()),
}


@pytest.mark.parametrize("door", list(DOORS))
def test_every_way_to_a_process_or_socket_is_refused_naming_the_test(door):
    with no_processes_or_sockets("tests/x.py::test_y") as refused, pytest.raises(UnmarkedTierError) as err:
        DOORS[door]()
    assert re.match(r"tests/x\.py::test_y (starts a process|forks|binds|connects) ", str(err.value))
    assert "@pytest.mark.integration" in str(err.value)
    assert len(refused) == 1


def test_a_refusal_the_code_under_test_swallowed_still_fails_the_test(request):
    careless = contextlib.suppress(BaseException)  # code under test that swallows everything
    with pytest.raises(UnmarkedTierError, match="binds a socket"), guarded(request.node), careless:
        _bind()


@pytest.mark.integration
def test_a_marked_test_may_start_processes_and_open_sockets(request):
    with guarded(request.node):
        assert subprocess.run([sys.executable, "-c", "pass"], check=False).returncode == 0
        _bind()


def test_the_tiers_are_declared_and_test_fast_leaves_every_one_out():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    names = {line.split(":")[0] for line in declared["markers"]}
    assert set(TIER_MARKERS) <= names
    makefile = (REPO / "Makefile").read_text()
    fast = re.search(r"^test-fast:.*\n(?:\t.*\n)*?\t.*-m \"([^\"]+)\"", makefile, re.M)
    assert fast, "make test-fast selects by marker"
    assert fast.group(1) == " and ".join(f"not {name}" for name in TIER_MARKERS)
