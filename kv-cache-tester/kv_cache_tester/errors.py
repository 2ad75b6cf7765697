"""Errors the replayer reports as one line and exit status 2 (bad input) or 1 (broken run).

Kept independent of agentsweep: the replayer installs and runs on its own. agentsweep's error family
(``agentsweep.errors``) derives from this one.
"""

from __future__ import annotations

import errno


class KVTesterError(Exception):
    """Base class: `prefix: message` on stderr, then exit with `exit_code`."""

    exit_code = 1
    prefix = "error"

    def render(self) -> str:
        return f"{self.prefix}: {self}"


class TraceError(KVTesterError):
    """A trace file or dataset is malformed. Message: `<file>: request <i>: <field>: <what>`."""

    exit_code = 2
    prefix = "trace error"


class UsageError(KVTesterError):
    """A command-line value is wrong."""

    exit_code = 2
    prefix = "usage error"


class RunAborted(KVTesterError):
    """The run could not go on (for example the circuit breaker saw the server gone)."""

    exit_code = 1
    prefix = "run aborted"


class WriteFailed(KVTesterError):
    """A result file could not be written (a full disk, say). Message: `<file>: cannot write: <why>`."""

    exit_code = 2
    prefix = "write error"

    def __init__(self, path: object, err: OSError) -> None:
        why = "no space left on device" if err.errno == errno.ENOSPC else (err.strerror or str(err)).lower()
        super().__init__(f"{path}: cannot write: {why}")
        self.errno = err.errno
