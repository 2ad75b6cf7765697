"""`agentsweep` command line: one subcommand per part, imported only when used.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import NoReturn

from kv_cache_tester.errors import KVTesterError

from agentsweep import __version__


class OneLineParser(argparse.ArgumentParser):
    """Reports a bad command line as one line (and exit 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"usage error: {self.prog}: {message} (see --help)\n")


# name -> (module, one-line help). Importing lazily keeps `engine-sim` and
# `metrics-collector` start-up free of pandas/matplotlib.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "matrix": ("agentsweep.config.cli", "expand a sweep config key into the matrix of cells (dry run)"),
    "preflight": (
        "agentsweep.preflight.cli",
        "check a key's cells against the cluster (Slurm, image, model, GPUs, ports) before allocating",
    ),
    "images": (
        "agentsweep.commands.images",
        "pin the shipped images by manifest digest (configs/images.lock.yaml), or print a tag's digest",
    ),
    "sweep": ("agentsweep.sweep.cli", "run a config key's cells on this machine, then collect"),
    "cell-jobs": (
        "agentsweep.sweep.jobs",
        "runs-on labels, launcher and time limit of each cell's job (the sweep workflow's plan)",
    ),
    "cell": ("agentsweep.commands.cell", "run one matrix cell (engine, scraper, replayer) into a result dir"),
    "engine-sim": ("agentsweep.engine_sim.cli", "serve the simulated vLLM/SGLang engine"),
    "metrics-collector": ("agentsweep.metrics.cli", "scrape an engine's /metrics into server_metrics.csv"),
    "router-metrics-collector": (
        "agentsweep.cell.routers.scrape",
        "scrape a router's /metrics into router_metrics.csv (requests per instance)",
    ),
    "power-sampler": (
        "agentsweep.energy.cli_sampler",
        "sample the cell's GPU power (DCGM exporter, nvidia-smi, amd-smi) into power.csv",
    ),
    "power-summary": (
        "agentsweep.energy.cli_summary",
        "a cell's energy, joules per token and power validity from its result directory",
    ),
    "plan": (
        "agentsweep.planner.cli",
        "agents per GPU and per MW under SLO tiers on each simulated hardware (virtual-clock capacity searches)",
    ),
    "collect": ("agentsweep.collect.cli_collect", "turn cell result dirs into summary, frontiers, report"),
    "pareto": ("agentsweep.collect.cli_pareto", "Pareto frontiers and plots from a summary.csv"),
    "compare": ("agentsweep.collect.cli_compare", "compare two collected sweeps cell by cell"),
    "export": (
        "agentsweep.export.cli",
        "a sweep's points as InferenceX agentic rows (flat or nested agentx-v1 JSON, schemas shipped)",
    ),
    "verify": ("agentsweep.store.cli_verify", "check result directories against their receipt.json"),
    "results": ("agentsweep.store.cli", "the results store: ingest runs, curves, history, noise-aware diffs"),
    "dashboard": ("agentsweep.dashboard.cli", "write (or serve) the store as an interactive offline site"),
    "accuracy": (
        "agentsweep.accuracy.cli",
        "score an endpoint's model on a task (GSM8K) with lm-evaluation-harness against a threshold",
    ),
    "calibrate": (
        "agentsweep.calibrate.cli",
        "simulated engine vs published points: run, or --fit the model",
    ),
}


def _top_help() -> str:
    width = max(len(n) for n in SUBCOMMANDS)
    lines = [
        f"usage: agentsweep [--version] [--debug] COMMAND [ARGS...]  (agentsweep {__version__})",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `agentsweep COMMAND --help` for a command's options."]
    return "\n".join(lines)


def _report(err: BaseException, debug: bool) -> None:
    if debug:
        traceback.print_exception(err)
    line = err.render() if isinstance(err, KVTesterError) else f"error: {err}"
    # A refused input may hold a secret (a token in engine_args, the environment's HF_TOKEN in a URL):
    # the line goes to logs before any mask is registered, so it is masked here.
    from agentsweep.cell.record import mask_text
    from agentsweep.contract.errors import printable

    line = printable(mask_text(line))  # a value in the message (a label, a file's text) prints escaped
    if os.environ.get("GITHUB_ACTIONS") == "true":
        print(f"::error::{line}", file=sys.stderr)
    else:
        print(line, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_help())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"agentsweep {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        import difflib

        close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        print(f"error: unknown command '{name}'{hint}; run `agentsweep --help`", file=sys.stderr)
        return 2
    module_name, help_ = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            print(f"error: command '{name}' is not available in this build", file=sys.stderr)
            return 2
        raise
    parser = OneLineParser(prog=f"agentsweep {name}", description=help_)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except KVTesterError as err:  # agentsweep's errors and the replayer's, raised in this process
        _report(err, debug)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader stopped reading (`... --json | head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush goes nowhere
        return 128 + 13  # as a shell reports a writer ended by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
