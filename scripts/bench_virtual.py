"""The virtual clock against the wall clock on the same cells: figures and wall time per cell.

Runs every cell of a config key (default: the demo grid) twice through benchmarks/run_cell.sh, as a
sweep runs a cell in its own process: on the wall clock (HTTP, the reference) and with ``clock:
virtual`` (one process, no socket); then the virtual cells once more as `agentsweep sweep --clock
virtual` runs them, all in the sweep's own process. With ``--repeat-wall`` the wall clock's cells
run once more, which measures its own run-to-run spread. Then it collects each tree and prints, per
figure, the largest and the median difference between the clocks (and the wall clock's spread), and
the wall time per cell of each way.

    .venv/bin/python scripts/bench_virtual.py [--key demo] [--only GLOB] [--duration S] [--repeat-wall] [--out DIR]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from agentsweep.cli import main as agentsweep
from agentsweep.config.matrix import select_cells
from agentsweep.contract.cell import CELL_ENV_VAR, Cell

REPO = Path(__file__).resolve().parent.parent
FIGURES = (
    "total_tok_per_s_per_gpu",
    "output_tok_per_s_per_gpu",
    "ttft_p50_s",
    "ttft_p90_s",
    "interactivity_p90_tok_per_s",
    "gpu_hit_rate",
)


def run_cell(cell: Cell, result_dir: Path) -> float:
    """Wall seconds of one cell run as a sweep runs it (its own process tree)."""
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    env |= {CELL_ENV_VAR: cell.to_json(), "RESULT_DIR": str(result_dir), "AGENTSWEEP_REPLAY_PLOT": "off"}
    start = time.perf_counter()
    proc = subprocess.run(
        [str(REPO / "benchmarks" / "run_cell.sh")], env=env, capture_output=True, text=True, check=False
    )
    took = time.perf_counter() - start
    status = (
        (result_dir / "status.txt").read_text().split("\n")[0]
        if (result_dir / "status.txt").exists()
        else "?"
    )
    print(f"  {cell.clock:7} {cell.exp_name:28} {status:8} {took:6.1f} s", flush=True)
    if proc.returncode not in (0, 3) and status == "?":
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
    return took


def tree(cells: list[Cell], root: Path, clock: str) -> tuple[pd.DataFrame, list[float]]:
    times = [run_cell(c.replace(clock=clock), root / "cells" / c.exp_name) for c in cells]
    out = root / "collected"
    agentsweep(["collect", str(root / "cells"), str(out), "--no-plots"])
    return pd.read_csv(out / "summary.csv").set_index("exp_name"), times


def in_sweep(key: str, only: str, duration: int | None, root: Path) -> float:
    """Wall seconds of `agentsweep sweep --clock virtual` over the cells (all in the sweep's process)."""
    argv = [sys.executable, "-m", "agentsweep.cli", "sweep", "--key", key, "--clock", "virtual"]
    argv += ["--results", str(root), "--no-collect", "--only", only]
    argv += ["--duration", str(duration)] if duration else []
    env = {**os.environ, "AGENTSWEEP_REPLAY_PLOT": "off"}
    start = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd=REPO)
    return time.perf_counter() - start


def differences(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name in FIGURES:
        pairs = [(a.loc[i, name], b.loc[i, name]) for i in a.index if i in b.index]
        out[name] = [abs(x / y - 1) for x, y in pairs if pd.notna(x) and pd.notna(y) and y]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--key", default="demo")
    parser.add_argument("--only", default="*", help="only cells whose exp_name matches this glob")
    parser.add_argument("--duration", type=int, default=None, help="every cell's replay duration (s)")
    parser.add_argument("--repeat-wall", action="store_true", help="run the wall clock twice (its spread)")
    parser.add_argument(
        "--out", type=Path, default=None, help="where the cells go (default: a temporary dir)"
    )
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="bench-virtual-"))
    cells = [c for c in select_cells(None, [args.key]) if fnmatch.fnmatchcase(c.exp_name, args.only)]
    if args.duration:
        cells = [c.replace(duration=args.duration) for c in cells]
    print(f"{len(cells)} cells of {args.key} in {root}")
    wall, wall_s = tree(cells, root / "wall", "wall")
    virtual, virtual_s = tree(cells, root / "virtual", "virtual")
    spread = differences(tree(cells, root / "wall2", "wall")[0], wall) if args.repeat_wall else None
    diff = differences(virtual, wall)
    statuses = {
        "wall": wall["status"].value_counts().to_dict(),
        "virtual": virtual["status"].value_counts().to_dict(),
    }
    print(
        f"\nverdicts: {json.dumps(statuses)}; same verdict on {(wall['status'] == virtual['status']).sum()} of {len(cells)}"
    )
    head = f"{'figure':32} {'virtual vs wall: median':>24} {'max':>8}"
    print(head + (f" {'wall vs wall: median':>22} {'max':>8}" if spread else ""))
    for name in FIGURES:
        d = diff[name]
        line = f"{name:32} {statistics.median(d):24.1%} {max(d):8.1%}"
        if spread:
            s = spread[name]
            line += f" {statistics.median(s):22.1%} {max(s):8.1%}"
        print(line)
    swept = in_sweep(args.key, args.only, args.duration, root / "swept") / len(cells)
    wall_cell = statistics.mean(wall_s)
    print(f"\nwall time per cell: wall clock {wall_cell:.2f} s")
    for how, seconds in (
        ("virtual clock, each cell in its own process", statistics.mean(virtual_s)),
        ("virtual clock, in the sweep's process", swept),
    ):
        print(f"  {how}: {seconds:.2f} s ({wall_cell / seconds:.1f}x shorter)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
