"""``python -m agentsweep.experimental.lmcache SOURCE --mooncake-out F --traces-out F``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentsweep.errors import AgentsweepError, InputError
from agentsweep.experimental.lmcache.convert import convert, hf_tokenizer, words


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agentsweep.experimental.lmcache",
        description="Convert LMCache agentic traces (parquet) into mooncake_trace JSONL for AIPerf "
        "and/or kv-cache-tester traces for the replayer.",
    )
    p.add_argument("source", type=Path, help="a .parquet shard or a directory of them")
    p.add_argument("--mooncake-out", type=Path, help="write mooncake_trace JSONL (AIPerf) here")
    p.add_argument("--traces-out", type=Path, help="write kv-cache-tester traces (JSONL) here")
    p.add_argument("--block-size", type=int, default=64, help="tokens per hash block (default 64)")
    p.add_argument(
        "--tokenizer",
        type=Path,
        help="local tokenizer.json (or its directory) for token counts; default: one word = one token, "
        "as the simulated engine counts",
    )
    p.add_argument(
        "--system-role",
        choices=("system", "developer"),
        default="system",
        help="role to give system messages (some chat templates want developer)",
    )
    p.add_argument("--limit", type=int, help="read at most this many rows (a quick sample)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.limit is not None and args.limit < 1:
            raise InputError(f"--limit: must be >= 1, got {args.limit}")
        tokenize = hf_tokenizer(args.tokenizer) if args.tokenizer else words
        report = convert(
            args.source,
            mooncake_out=args.mooncake_out,
            traces_out=args.traces_out,
            block_size=args.block_size,
            tokenize=tokenize,
            system_role=args.system_role,
            limit=args.limit,
        )
    except AgentsweepError as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code
    print(report.line())
    for label, path in (("mooncake_trace", args.mooncake_out), ("traces", args.traces_out)):
        if path is not None:
            print(f"{label}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
