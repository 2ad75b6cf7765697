"""The project's error family, rendered once at the CLI boundary (see agentsweep.cli.main).

Bad input of any kind (a config, a trace, an artifact, a server reply) exits 2 with one line that
names what and where; a run that broke exits 1.
"""

from __future__ import annotations


class AgentsweepError(Exception):
    """Base class: `prefix: message` on stderr, then exit with `exit_code`."""

    exit_code = 1
    prefix = "error"

    def render(self) -> str:
        return f"{self.prefix}: {self}"


class ConfigError(AgentsweepError):
    """A sweep config or runners file is wrong. Message: `<file>:<key>.<field>: <what is wrong>`."""

    exit_code = 2
    prefix = "config error"


class InputError(AgentsweepError):
    """Bad input other than a config: an artifact, a trace, a server reply, a command-line value."""

    exit_code = 2
    prefix = "input error"


class RunError(AgentsweepError):
    """A run could not complete (engine never healthy, engine died, scrape target gone...)."""

    exit_code = 1
    prefix = "run error"


class ResultFileError(InputError):
    """A file of a cell result directory breaks its contract. Message: `<file>: <field>: <what>`."""

    prefix = "result error"


class WriteError(AgentsweepError):
    """A file could not be written (a full disk, say). Message: `<path>: cannot write: <why>`; exit 2,
    as bad input: what was asked for was not made, and nothing written stands as complete."""

    exit_code = 2
    prefix = "write error"

    def __init__(self, path: object, err: OSError) -> None:
        import errno

        why = "no space left on device" if err.errno == errno.ENOSPC else (err.strerror or str(err)).lower()
        super().__init__(f"{path}: cannot write: {why}")
        self.errno = err.errno

    @classmethod
    def after(cls, err: WriteError, what: str) -> WriteError:
        """``err`` with what became of the rest added: `<path>: cannot write: <why>; <what>`."""
        again = cls.__new__(cls)
        Exception.__init__(again, f"{err}; {what}")
        again.errno = err.errno
        return again
