"""Every command that writes a folder or a file of outputs takes it as `-o/--output` (collect and
pareto also as their last argument, compare, dashboard and calibrate also as the older `--out`)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest
from agentsweep.cli import SUBCOMMANDS
from agentsweep.errors import InputError

# command -> the arguments before the output option, and where the parsed output lands.
WRITERS = {
    "collect": (["artifacts"], "output"),
    "pareto": (["summary.csv"], "output"),
    "compare": (["a", "b"], "out"),
    "dashboard": ([], "out"),
    "export": (["results", "--format", "inferencex"], "output"),
}


def _parse(command: str, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=command)
    importlib.import_module(SUBCOMMANDS[command][0]).add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize("spelling", ["-o", "--output"])
@pytest.mark.parametrize("command", sorted(WRITERS))
def test_the_output_is_spelled_the_same_everywhere(command: str, spelling: str) -> None:
    before, dest = WRITERS[command]
    args = _parse(command, [*before, spelling, "out"])
    assert getattr(args, dest) == Path("out")


def test_collect_takes_its_folder_once() -> None:
    from agentsweep.collect.cli_collect import out_dir_of

    assert out_dir_of(_parse("collect", ["art", "agg"])) == Path("agg")
    assert out_dir_of(_parse("collect", ["art", "-o", "agg"])) == Path("agg")
    with pytest.raises(InputError, match="no output folder"):
        out_dir_of(_parse("collect", ["art"]))
    with pytest.raises(InputError, match="two output folders"):
        out_dir_of(_parse("collect", ["art", "agg", "-o", "other"]))
