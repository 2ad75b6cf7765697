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
import os
import tempfile
from pathlib import Path

from kv_cache_tester.errors import UsageError
from kv_cache_tester.traces.synth import LengthSpec, synth_workload


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


def run(args: argparse.Namespace) -> int:
    isl = LengthSpec.parse(args.isl, "--isl")
    osl = LengthSpec.parse(args.osl, "--osl")
    out: Path = args.output
    suffix = out.name.rsplit(".", 1)[-1] if "." in out.name else ""
    if suffix not in ("json", "jsonl"):
        raise UsageError(f"--output {out}: expected a .jsonl or .json file name")
    if args.block_size < 1:
        raise UsageError(f"--block-size {args.block_size}: must be at least 1")
    traces = synth_workload(
        isl, osl, args.count, seed=args.seed, shared_prefix=args.shared_prefix, block_size=args.block_size
    )
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{out.name}.")
    except OSError as err:
        raise UsageError(f"--output {out}: {err.strerror or err}") from None
    n_in = n_out = 0
    try:
        with os.fdopen(fd, "w") as fh:
            if suffix == "json":
                fh.write("[\n")
            for i, trace in enumerate(traces):
                req = trace["requests"][0]
                n_in += req["in"]
                n_out += req["out"]
                if suffix == "json":
                    fh.write((",\n" if i else "") + json.dumps(trace, separators=(",", ":")))
                else:
                    fh.write(json.dumps(trace, separators=(",", ":")) + "\n")
            if suffix == "json":
                fh.write("\n]\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
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
    if shared:
        print(
            "note: shared-prefix traces use global hash ids, so a trace played twice (--recycle) sends the "
            "same prompt again; write at least as many requests as the run will send"
        )
    return 0
