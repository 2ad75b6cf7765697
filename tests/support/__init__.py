"""Shared test support: waiting with a deadline, free ports, the processes tests start, the tier guard.

Import from here (``from tests.support import wait_until``); the test directories are not packages, and
pytest's importlib mode resolves ``tests.support`` from the repository root.
"""

from .busy_machine import CLIENT_ROOM
from .canned_http import CannedServer, canned_server
from .disk import filled_tmpfs
from .ports import free_port
from .processes import MarkedTree, pid_running, running_engine_sim, stop_process
from .waits import (
    LineFound,
    WaitTimeout,
    http_status,
    poll_until,
    served_url,
    wait_for_file,
    wait_for_http,
    wait_for_line,
    wait_until,
)

__all__ = [
    "CLIENT_ROOM",
    "CannedServer",
    "LineFound",
    "MarkedTree",
    "WaitTimeout",
    "canned_server",
    "filled_tmpfs",
    "free_port",
    "http_status",
    "pid_running",
    "poll_until",
    "running_engine_sim",
    "served_url",
    "stop_process",
    "wait_for_file",
    "wait_for_http",
    "wait_for_line",
    "wait_until",
]
