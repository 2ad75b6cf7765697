"""`kv-cache-tester` command line: `replay`, `analyze` and `synth`, imported only when used.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from typing import NoReturn

from kv_cache_tester import __version__
from kv_cache_tester.errors import KVTesterError


class OneLineParser(argparse.ArgumentParser):
    """Reports a bad command line as one line (and exit 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"usage error: {self.prog}: {message} (see --help)\n")


SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("kv_cache_tester.replay.cli", "replay traces at N concurrent users against an engine"),
    "analyze": ("kv_cache_tester.traces.cli", "trace statistics and theoretical prefix-cache hits"),
    "synth": (
        "kv_cache_tester.traces.synth_cli",
        "write fixed-length synthetic request traces (random prompts)",
    ),
}


def run_subcommand(name: str, rest: list[str], debug: bool = False) -> int:
    module_name, help_ = SUBCOMMANDS[name]
    module = importlib.import_module(module_name)
    parser = OneLineParser(prog=f"kv-cache-tester {name}", description=help_)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except KVTesterError as err:
        if debug:
            traceback.print_exception(err)
        print(err.render(), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: kv-cache-tester [--version] [--debug] {{{','.join(SUBCOMMANDS)}}} ...")
        for name, (_, help_) in SUBCOMMANDS.items():
            print(f"  {name:<8} {help_}")
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"kv-cache-tester {__version__}")
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(f"error: unknown command '{argv[0]}'; choose from {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    return run_subcommand(argv[0], argv[1:], debug)


if __name__ == "__main__":
    sys.exit(main())
