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
