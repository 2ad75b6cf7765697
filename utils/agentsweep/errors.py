"""The project's error family, rendered once at the CLI boundary (see agentsweep.cli.main).

Bad input of any kind (a config, a trace, an artifact, a server reply) exits 2 with one line that
names what and where; a run that broke exits 1. The family's base is the replayer's
(``kv_cache_tester.errors``): agentsweep runs the replayer's code in-process too (trace loading,
result files), and one ``except KVTesterError`` at each boundary renders either kind as one line.
"""

from __future__ import annotations

from kv_cache_tester.errors import KVTesterError, WriteFailed


class AgentsweepError(KVTesterError):
    """Base class: `prefix: message` on stderr, then exit with `exit_code`."""

    exit_code = 1
    prefix = "error"


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


class WriteError(WriteFailed, AgentsweepError):
    """A file could not be written (a full disk, say). Message: `<path>: cannot write: <why>`; exit 2,
    as bad input: what was asked for was not made, and nothing written stands as complete. The
    message and the disk-full wording are the replayer's ``WriteFailed``."""

    exit_code = 2
    prefix = "write error"

    @classmethod
    def after(cls, err: WriteError, what: str) -> WriteError:
        """``err`` with what became of the rest added: `<path>: cannot write: <why>; <what>`."""
        again = cls.__new__(cls)
        Exception.__init__(again, f"{err}; {what}")
        again.errno = err.errno
        return again
