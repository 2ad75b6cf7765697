"""`agentsweep power-sampler`: sample GPU power into power.csv until SIGTERM/SIGINT (or --seconds).

A cell starts it with ``--spec`` (one JSON value, see ``agentsweep.energy.spec``); a person can point it
at this host's GPUs with ``--source``.
"""

from __future__ import annotations

import argparse
import socket
import threading
from pathlib import Path

from agentsweep.contract.base import MAX_POWER_INTERVAL_S, MIN_POWER_INTERVAL_S
from agentsweep.energy.sampler import Sampler
from agentsweep.energy.spec import DEFAULT_DCGM_ENDPOINT, PowerTarget, SamplerSpec
from agentsweep.errors import InputError

MAX_SECONDS = 7 * 86400.0


def interval(text: str) -> float:
    """An argparse type: seconds between samples, within the cell contract's bounds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not MIN_POWER_INTERVAL_S <= value <= MAX_POWER_INTERVAL_S:
        raise argparse.ArgumentTypeError(
            f"must be from {MIN_POWER_INTERVAL_S:g} to {MAX_POWER_INTERVAL_S:g} seconds, got {text}"
        )
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be > 0 and at most {MAX_SECONDS:g}, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, type=Path, help="power.csv to append to")
    parser.add_argument("--spec", help="the sampler's spec as JSON, or @FILE (what a cell passes)")
    parser.add_argument("--source", choices=("nvidia-smi", "amd-smi", "dcgm"), help="sample this host's GPUs")
    parser.add_argument("--gpus", default="", help="with --source: GPU ids, comma-separated (default: all)")
    parser.add_argument("--endpoint", default="", help="with --source dcgm: the exporter's /metrics URL")
    parser.add_argument(
        "--interval", type=interval, default=0.5, help="seconds between samples (default 0.5)"
    )
    parser.add_argument(
        "--seconds", type=_seconds, default=None, help="stop after this long (default: a signal)"
    )


def spec_of(args: argparse.Namespace) -> SamplerSpec:
    """The sampler's spec from its flags (--spec, or --source with --gpus and --endpoint)."""
    if args.spec and args.source:
        raise InputError("power-sampler: give --spec or --source, not both")
    if args.spec:
        text = args.spec
        if text.startswith("@"):
            try:
                text = Path(text[1:]).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise InputError(f"--spec {args.spec}: cannot read ({err})") from None
        return SamplerSpec.parse(text)
    if not args.source:
        raise InputError("power-sampler: give --spec JSON or --source nvidia-smi|amd-smi|dcgm")
    gpus = tuple(g.strip() for g in args.gpus.split(",") if g.strip())
    endpoint = args.endpoint
    if args.source == "dcgm" and not endpoint:
        endpoint = DEFAULT_DCGM_ENDPOINT.format(address="localhost")
    node = socket.gethostname().split(".")[0]
    target = PowerTarget(node=node, count=max(1, len(gpus)), gpus=gpus, endpoint=endpoint)
    return SamplerSpec(source=args.source, interval_s=args.interval, targets=(target,))


def run(args: argparse.Namespace) -> int:
    if args.output.exists() and args.output.is_dir():
        raise InputError(f"--output: {args.output} is a directory")
    sampler = Sampler(spec_of(args), args.output)
    if args.seconds is not None:
        timer = threading.Timer(args.seconds, sampler.stop.set)
        timer.daemon = True
        timer.start()
    sampler.run_until_signalled()
    return 0
