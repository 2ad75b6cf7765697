"""``python -m agentsweep.experimental.flamegraphs RESULT_DIR [--output DIR] [--max-traces N]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kv_cache_tester.replay import REQUESTS_FILE

from agentsweep.errors import AgentsweepError
from agentsweep.experimental.flamegraphs.render import render


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m agentsweep.experimental.flamegraphs",
        description="Per-trace icicle charts of server-reported cached vs computed prompt tokens "
        "against the theoretical prefix hit, from a cell's requests.jsonl.",
    )
    p.add_argument("source", type=Path, help="a cell result directory or its requests.jsonl")
    p.add_argument("--output", type=Path, help="output directory (default: SOURCE_DIR/flamegraphs)")
    p.add_argument("--max-traces", type=int, default=40, help="draw at most N traces, worst loss first")
    args = p.parse_args(argv)
    path = args.source / REQUESTS_FILE if args.source.is_dir() else args.source
    out = args.output or path.parent / "flamegraphs"
    try:
        index, pngs = render(path, out, max_traces=args.max_traces)
    except AgentsweepError as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code
    print(f"{len(pngs)} flamegraphs, index: {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
