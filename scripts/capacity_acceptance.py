#!/usr/bin/env python3
"""A capacity search against an independent grid of ordinary cells, on the simulated engine.

    .venv/bin/python scripts/capacity_acceptance.py                 # range 2..16, about 7 minutes on 2 cores
    .venv/bin/python scripts/capacity_acceptance.py --low 2 --high 6 --duration 8   # a small one

Writes a config with two keys into RESULTS (default results/capacity-acceptance): one capacity cell
searching LOW..HIGH users, and a grid of ordinary cells at every user count of that range, same
engine, traces, replay options and SLO tiers. Runs both through `agentsweep sweep` (the capacity
cell starts the engine once; each grid cell starts its own), then prints per tier the search's
boundary (its interval and type) beside the boundary read from the grid, whether they agree (the
grid's within the search's interval widened by its resolution), and the engine-seconds each spent.
Exit status 0 when every tier agrees and the search spent fewer engine-seconds, 1 otherwise.

The default configuration: Llama-3.1-8B on the simulated H200 (TP 1, speed 50), the 20 sample
traces (16 users at most: one trace per lane), 64k-token sessions entered half way; tiers bound by
output speed, with boundaries between 8 and 16 users. --keep reuses finished runs in RESULTS.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SEARCH_KEY = "capacity-acceptance-search"
GRID_KEY = "capacity-acceptance-grid"
DEFAULT_TIERS = {
    "interactive": ["ttft p90 <= 10 s", "speed p25 >= 28 tok/s"],
    "fast": ["ttft p90 <= 5 s", "speed p25 >= 40 tok/s"],
}


def config(args: argparse.Namespace) -> dict[str, object]:
    entry: dict[str, object] = {
        "runner": "local",
        "engine": "sim",
        "model": args.model,
        "precision": "fp8",
        "image": "",
        "duration": args.duration,
        "speed": args.speed,
        "traces": "kv-cache-tester/sample_traces",
        "replay": {"max_context": 65536, "advance_max": 0.5},
        "slo": DEFAULT_TIERS if not args.slo else dict(_tier(text) for text in args.slo),
    }
    if args.engine_args:
        entry["engine_args"] = shlex.split(args.engine_args)
    search = {"search": [args.low, args.high], "repeats": args.repeats}
    grid = list(range(args.low, args.high + 1))
    return {
        SEARCH_KEY: {**entry, "search_space": {"tp1": {"users": search, "offload": ["off"]}}},
        GRID_KEY: {**entry, "search_space": {"tp1": {"users": grid, "offload": ["off"]}}},
    }


def _tier(text: str) -> tuple[str, list[str]]:
    name, _colon, rest = text.partition(":")
    return name.strip(), [part.strip() for part in rest.split(",") if part.strip()]


def sweep(config_path: Path, key: str, results: Path, keep: bool) -> None:
    command = [
        sys.executable, "-m", "agentsweep.cli", "sweep", "--config", str(config_path), "--key", key,
        "--results", str(results), "--resume" if keep else "--force",
    ]  # fmt: skip
    print(f"$ {shlex.join(command)}", flush=True)
    code = subprocess.run(command, cwd=REPO, check=False).returncode
    if code not in (0, 3):  # 3: every cell ran, some INVALID (past a boundary, expected)
        sys.exit(f"capacity_acceptance: `agentsweep sweep --key {key}` exited with status {code}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=REPO / "results" / "capacity-acceptance")
    parser.add_argument("--low", type=int, default=2)
    parser.add_argument("--high", type=int, default=16)
    parser.add_argument(
        "--duration", type=int, default=12, help="replay seconds (wall) per step and per cell"
    )
    parser.add_argument("--speed", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct")
    parser.add_argument("--engine-args", default="", help="extra simulated-engine flags (one string)")
    parser.add_argument("--slo", action="append", help="'NAME: CONSTRAINT, ...' (replaces the default tiers)")
    parser.add_argument("--keep", action="store_true", help="reuse finished runs in RESULTS (--resume)")
    args = parser.parse_args()

    sys.path[:0] = [str(REPO / "utils"), str(REPO / "kv-cache-tester")]
    from agentsweep.capacity.compare import compare

    args.results.mkdir(parents=True, exist_ok=True)
    config_path = args.results / "acceptance.yaml"
    config_path.write_text(yaml.safe_dump(config(args), sort_keys=False), encoding="utf-8")
    sweep(config_path, SEARCH_KEY, args.results, args.keep)
    sweep(config_path, GRID_KEY, args.results, args.keep)

    search_dirs = sorted(p for p in (args.results / SEARCH_KEY).iterdir() if (p / "capacity.json").exists())
    grid_dirs = sorted(p for p in (args.results / GRID_KEY).iterdir() if (p / "cell.json").exists())
    if len(search_dirs) != 1 or not grid_dirs:
        sys.exit(f"capacity_acceptance: expected one capacity cell and a grid under {args.results}")
    result = compare(search_dirs[0], grid_dirs)

    print()
    print(f"search: {search_dirs[0].name}, {result.search_steps} steps, one engine start")
    print(f"grid:   {result.grid_cells} cells ({args.low}..{args.high} users), one engine start each")
    print()
    header = f"{'tier':<12} {'search boundary':<26} {'grid boundary':<22} agrees"
    print(header)
    print("-" * len(header))
    for tier in result.tiers:
        s = tier.search
        interval = s.interval_users or (None, None)
        search_text = f"{s.boundary_users} ({interval[0]}–{interval[1]}, {s.boundary_type})"
        grid_text = "-" if tier.grid is None else f"{tier.grid.boundary_users:g} ({tier.grid.kind})"
        print(
            f"{tier.tier:<12} {search_text:<26} {grid_text:<22} {'yes' if tier.agrees else 'NO'}: {tier.why}"
        )
    print()
    for tier in result.tiers:
        print(f"search: {tier.search.line}")
    print()
    ratio = result.search_engine_s / result.grid_engine_s if result.grid_engine_s else float("nan")
    print(
        f"engine-seconds (wall): search {result.search_engine_s:.0f} s, grid {result.grid_engine_s:.0f} s "
        f"(search/grid {ratio:.2f}); in the simulated engine's clock x{args.speed:g}: "
        f"{result.search_engine_s * args.speed:,.0f} s vs {result.grid_engine_s * args.speed:,.0f} s"
    )
    ok = result.agrees and result.cheaper
    print(f"acceptance: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
