"""`kv-cache-tester analyze TRACES`: corpus statistics and theoretical prefix-cache hits.

Writes, with --output-dir D: D/trace_stats.json (load report, counts, distributions, hit rates),
D/request_hits.jsonl (one line per request) and D/trace_stats.png (needs matplotlib). Always prints a
short summary.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from kv_cache_tester.errors import UsageError
from kv_cache_tester.traces.analysis import corpus_stats, hit_summary, request_hits, write_histograms_png
from kv_cache_tester.traces.loaders import load_traces

SCHEMA_VERSION = 1


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", help="trace directory, file (.json/.jsonl), or hf:<org>/<dataset>")
    parser.add_argument("--cache-blocks", type=_non_negative, default=None, help="finite LRU size in blocks")
    parser.add_argument(
        "--second-tier-blocks", type=_non_negative, default=0, help="second (offload) tier size in blocks"
    )
    parser.add_argument("--output-dir", type=Path, default=None, help="write JSON, JSONL and PNG here")
    parser.add_argument("--max-context", type=_non_negative, default=0, help="0 = no limit")
    parser.add_argument("--max-context-mode", choices=("drop", "truncate"), default="drop")
    parser.add_argument("--min-requests", type=_non_negative, default=1)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> int:
    if args.second_tier_blocks and args.cache_blocks is None:
        raise UsageError("--second-tier-blocks needs --cache-blocks")
    result = load_traces(
        args.traces,
        max_context=args.max_context or None,
        max_context_mode=args.max_context_mode,
        min_requests=args.min_requests,
    )
    for line in result.report.lines():
        print(line)
    records = request_hits(
        result.traces, cache_blocks=args.cache_blocks, second_tier_blocks=args.second_tier_blocks
    )
    hits = hit_summary(records)
    stats = {
        "schema_version": SCHEMA_VERSION,
        "source": result.source,
        "dataset": result.dataset,
        "load_report": result.report.to_dict(),
        "cache": {"cache_blocks": args.cache_blocks, "second_tier_blocks": args.second_tier_blocks, **hits},
        **corpus_stats(result.traces),
    }
    dist = stats["distributions"]
    print(
        f"requests {stats['counts']['requests']}: ISL p50 {dist['isl']['p50']:.0f} max {dist['isl']['max']}, "
        f"OSL p50 {dist['osl']['p50']:.0f}; infinite-cache hit rate {hits['infinite_hit_rate']:.3f}"
        + (f", LRU hit rate {hits['lru_hit_rate']:.3f}" if hits["lru_hit_rate"] is not None else "")
        + (
            f" (+{hits['lru_tier2_hit_rate']:.3f} second tier)"
            if args.second_tier_blocks and hits["lru_tier2_hit_rate"] is not None
            else ""
        )
    )
    if args.output_dir is None:
        return 0
    try:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--output-dir {args.output_dir}: {err.strerror or err}") from None
    _write_atomic(args.output_dir / "trace_stats.json", json.dumps(stats, indent=2) + "\n")
    _write_atomic(
        args.output_dir / "request_hits.jsonl", "".join(json.dumps(r.to_dict()) + "\n" for r in records)
    )
    written = ["trace_stats.json", "request_hits.jsonl"]
    if not args.no_plot:
        if write_histograms_png(result.traces, records, str(args.output_dir / "trace_stats.png")):
            written.append("trace_stats.png")
        else:
            print("matplotlib not installed (extra 'plots'): no PNG written")
    print(f"wrote {', '.join(written)} to {args.output_dir}")
    return 0
