"""`agentsweep matrix`: expand config keys into the matrix of cells and show it (a dry run)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from kv_cache_tester.errors import KVTesterError

from agentsweep.config import overrides, render
from agentsweep.config.loader import load_runners, read_config_file
from agentsweep.config.matrix import MAX_MATRIX_CELLS, Selection, select
from agentsweep.config.schema import RunnerSpec
from agentsweep.contract.resultdir import matrix_json
from agentsweep.errors import ConfigError, InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="sweep config file (default: configs/agentic.yaml in the current directory, else the repo's)",
    )
    parser.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="KEY",
        help="config key or glob (repeatable), e.g. --key demo --key 'b200-*'",
    )
    parser.add_argument("--tp", metavar="N,N", help="keep only these TP sizes (comma list)")
    parser.add_argument("--users", metavar="N,N", help="keep only these user counts (comma list)")
    parser.add_argument("--offload", metavar="MODE,MODE", help="keep only these modes: on, off, noprefix")
    parser.add_argument("--max-tp", metavar="N", help="drop cells with TP above N")
    parser.add_argument("--duration", metavar="S", help="override every cell's replay duration (seconds)")
    overrides.add_arguments(parser)
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help='print {"include": [...]} (GitHub matrix shape)')
    out.add_argument(
        "--github-output",
        action="store_true",
        help="write matrix=<json>, count=, max_parallel= to $GITHUB_OUTPUT and a table to "
        "$GITHUB_STEP_SUMMARY",
    )
    out.add_argument(
        "--table", action="store_true", help="print the table even when stdout is not a terminal"
    )
    out.add_argument("--list", action="store_true", help="list the config keys of the file and exit")
    out.add_argument(
        "--each-key",
        action="store_true",
        help="dry-run every key of the file on its own, a table each, in one process (CI's check of a "
        "config file); every bad key is named, and the exit status is 2 when there is one",
    )


def _list_keys(config_path: str | None) -> int:
    config = read_config_file(config_path)
    width = max(len(k) for k in config.entries)
    for key, raw in config.entries.items():
        desc = raw.get("description", "") if isinstance(raw, dict) else ""
        print(f"{key:<{width}}  {desc}".rstrip())
    return 0


def _each_key(args: argparse.Namespace) -> int:
    """Each key expanded and shown as ``agentsweep matrix --key KEY --table`` would, one after another;
    a bad key is one line on stderr and the next key follows. In GitHub Actions each key is a log group."""
    config = read_config_file(args.config)
    runners = load_runners()  # once: a bad runners file is one error, not one per key
    grouped = os.environ.get("GITHUB_ACTIONS") == "true"
    bad: list[str] = []
    for key in config.entries:
        print(f"::group::{config.shown}: {key}" if grouped else f"== {config.shown}: {key}", flush=True)
        try:
            print(render.table(_selection(args, [key], runners).cells), flush=True)
        except KVTesterError as err:
            print(err.render(), file=sys.stderr, flush=True)
            bad.append(key)
        if grouped:
            print("::endgroup::", flush=True)
    if bad:
        raise ConfigError(
            f"{config.shown}: {len(bad)} of {len(config.entries)} keys are bad: {', '.join(bad)}"
        )
    return 0


def _selection(
    args: argparse.Namespace, keys: list[str], runners: Mapping[str, RunnerSpec] | None = None
) -> Selection:
    """The cells of ``keys`` with the command line's filters and overrides (``runners``: the runners
    file as loaded, else loaded here)."""
    tp = overrides.comma_list("--tp", args.tp, overrides.positive_int)
    users = overrides.comma_list("--users", args.users, overrides.positive_int)
    offload = overrides.comma_list("--offload", args.offload, lambda _flag, item: item)
    max_tp = None if args.max_tp is None else overrides.positive_int("--max-tp", args.max_tp)
    duration = None if args.duration is None else overrides.positive_int("--duration", args.duration)
    return select(
        args.config,
        keys,
        tp,
        users,
        offload,
        max_tp,
        duration,
        runners=runners,
        max_cells=MAX_MATRIX_CELLS,
        slo=overrides.slo_tiers(args.slo),
        search=overrides.user_search(args.search),
    )


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list_keys(args.config)
    if args.each_key:
        if args.key:
            raise InputError("--each-key takes every key of the file; leave out --key")
        return _each_key(args)
    if not args.key:
        raise InputError("give at least one --key (globs allowed; `agentsweep matrix --list` shows the keys)")
    # "a, b" in the workflow's input: the spaces are no part of a key
    selection = _selection(args, [key.strip() for key in args.key])
    cells = selection.cells
    if args.github_output:
        limits = {spec.key: spec.max_parallel for spec in selection.specs}
        missing = render.write_github_output(cells, os.environ, limits)
        if missing:
            print(matrix_json(cells))
            print(
                f"note: {' and '.join('$' + m for m in missing)} not set; printed the matrix instead",
                file=sys.stderr,
            )
        else:
            print(render.table(cells))
        return 0
    if args.json or (not args.table and not sys.stdout.isatty()):
        print(matrix_json(cells))
        return 0
    print(render.table(cells))
    return 0
