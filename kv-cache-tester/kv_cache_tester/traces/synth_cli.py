"""`kv-cache-tester synth`: write a fixed-length synthetic workload as a trace file.

The traces are what vLLM's and SGLang's "random" benchmarks send (independent prompts of an input
length, each generating an output length, optionally behind a common prefix), in the usual trace
format, so `replay` runs them like any other trace file:

    kv-cache-tester synth --isl 8192 --osl 1024 --count 512 --output random_8k1k.jsonl
    kv-cache-tester replay --trace-directory random_8k1k.jsonl --max-users 16 --recycle --ignore-eos ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from kv_cache_tester.errors import UsageError
from kv_cache_tester.inputfiles import size_text
from kv_cache_tester.traces.loaders import MAX_TRACE_BYTES
from kv_cache_tester.traces.synth import MAX_SYNTH_COUNT, MAX_SYNTH_TOKENS, LengthSpec, synth_workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", "-o", type=Path, required=True, help="trace file to write (.jsonl or .json)"
    )
    parser.add_argument(
        "--isl",
        required=True,
        help="input tokens: N, uniform:LO:HI, normal:MEAN:STD or lognormal:MEDIAN:SIGMA",
    )
    parser.add_argument("--osl", required=True, help="output tokens (same forms as --isl)")
    parser.add_argument("--count", type=int, default=1000, help="number of requests (one trace each)")
    parser.add_argument("--seed", type=int, default=0, help="lengths are drawn from this seed")
    parser.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="tokens every prompt starts with (whole blocks; 0 = no reuse, every prompt new)",
    )
    parser.add_argument("--block-size", type=int, default=64, help="tokens per hash block")


class _Stopped(BaseException):
    """SIGTERM or SIGHUP reached synth: unwinding removes the temporary file."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(signum)


def estimated_bytes(isl: LengthSpec, count: int, block_size: int) -> int:
    """About how large the file will be: mostly the hash ids, one per block of each prompt."""
    if isl.kind == "uniform":
        mean = (isl.a + isl.b) / 2
    elif isl.kind == "lognormal":
        mean = min(float(MAX_SYNTH_TOKENS), isl.a * math.exp(isl.b * isl.b / 2))
    else:
        mean = max(1.0, isl.a)
    blocks = math.ceil(mean / block_size)
    return count * (130 + blocks * (len(str(blocks)) + 1))


def run(args: argparse.Namespace) -> int:
    isl = LengthSpec.parse(args.isl, "--isl")
    osl = LengthSpec.parse(args.osl, "--osl")
    out: Path = args.output
    suffix = out.name.rsplit(".", 1)[-1] if "." in out.name else ""
    if suffix not in ("json", "jsonl"):
        raise UsageError(f"--output {out}: expected a .jsonl or .json file name")
    if out.exists() and not out.is_file():
        raise UsageError(f"--output {out}: exists and is not a regular file")
    if not 1 <= args.count <= MAX_SYNTH_COUNT:
        raise UsageError(f"--count {args.count}: must be from 1 to {MAX_SYNTH_COUNT}")
    if args.block_size < 1:
        raise UsageError(f"--block-size {args.block_size}: must be at least 1")
    guess = estimated_bytes(isl, args.count, args.block_size)
    if guess > MAX_TRACE_BYTES:
        raise UsageError(
            f"--count {args.count} x --isl {isl}: about {size_text(guess)}, over the "
            f"{size_text(MAX_TRACE_BYTES)} a trace file may hold; write fewer or shorter requests"
        )
    clipped: tuple[list[int], list[int]] = ([0], [0])
    traces = synth_workload(
        isl,
        osl,
        args.count,
        seed=args.seed,
        shared_prefix=args.shared_prefix,
        block_size=args.block_size,
        clipped=clipped,
    )
    parent = out.parent if str(out.parent) else Path(".")
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{out.name}.")
        except OSError as err:
            raise UsageError(f"--output {out}: {err.strerror or err}") from None
        try:
            n_in, n_out = _write(fd, traces, suffix, out)
            os.chmod(tmp, 0o644)
            os.replace(tmp, out)
        except BaseException as err:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(err, OSError):
                raise UsageError(f"--output {out}: cannot write: {err.strerror or err}") from None
            raise
    except (_Stopped, KeyboardInterrupt) as err:
        signum = err.signum if isinstance(err, _Stopped) else signal.SIGINT
        print(f"synth: stopped by {signal.Signals(signum).name}; {out} not written", file=sys.stderr)
        return 128 + signum
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    shared = args.shared_prefix // args.block_size * args.block_size
    print(
        f"wrote {args.count} requests to {out}: input {isl} (mean {n_in / args.count:.1f}), "
        f"output {osl} (mean {n_out / args.count:.1f}), shared prefix {shared} tokens"
        + (
            f" (--shared-prefix {args.shared_prefix} rounded down to whole {args.block_size}-token blocks)"
            if shared != args.shared_prefix
            else ""
        )
    )
    for what, (n,) in (("input", clipped[0]), ("output", clipped[1])):
        if n:
            print(
                f"note: {n} of {args.count} {what} lengths drawn outside [1, {MAX_SYNTH_TOKENS}] "
                "(or inside the shared prefix) were clipped to it; the means above are after clipping"
            )
    if shared:
        print(
            "note: shared-prefix traces use global hash ids, so a trace played twice (--recycle) sends the "
            "same prompt again; write at least as many requests as the run will send"
        )
    return 0


def _write(fd: int, traces: Iterator[dict[str, Any]], suffix: str, out: Path) -> tuple[int, int]:
    """Write the traces to ``fd``; (input tokens, output tokens). Over the loader's limit: UsageError."""
    n_in = n_out = size = 0
    with os.fdopen(fd, "w") as fh:
        if suffix == "json":
            fh.write("[\n")
        for i, trace in enumerate(traces):
            req = trace["requests"][0]
            n_in += req["in"]
            n_out += req["out"]
            text = json.dumps(trace, separators=(",", ":"))
            text = ((",\n" if i else "") + text) if suffix == "json" else text + "\n"
            size += len(text)
            if size > MAX_TRACE_BYTES:
                raise UsageError(
                    f"--output {out}: over the {size_text(MAX_TRACE_BYTES)} a trace file may hold after "
                    f"{i} requests; nothing written (write fewer or shorter requests)"
                )
            fh.write(text)
        if suffix == "json":
            fh.write("\n]\n")
    return n_in, n_out
