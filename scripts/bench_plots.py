#!/usr/bin/env python3
"""Measure the CPU of each plot `agentsweep collect` draws, on one folder of cell result directories.

    .venv/bin/python scripts/bench_plots.py results/demo --runs 5

Reads the cells as collect does (the same table), then draws every figure ``--runs`` times into a
temporary folder and prints each figure's median CPU seconds (this process's, so other load on the
machine moves it less than wall time) and their total. Run it before and after a change to the plots.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agentsweep.collect import plots
from agentsweep.collect.aggregate import build_rows, to_frame
from agentsweep.collect.discover import find_cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifacts", type=Path, help="folder of cell result directories (results/<key>)")
    parser.add_argument("--runs", type=int, default=5, help="draws of each figure (median reported)")
    args = parser.parse_args()
    found = find_cells(args.artifacts, [])
    if not found:
        print(f"{args.artifacts}: no cell result directories found", file=sys.stderr)
        return 2
    df = to_frame(build_rows(found, None))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        figures: list[tuple[str, Callable[[], object]]] = [
            ("pareto.png", lambda: plots.main_pareto_figure(df, out / "pareto.png")),
            *[
                (f"pareto_{y}.png", lambda y=y: plots.pareto_figure(df, y, out / f"pareto_{y}.png"))
                for y in plots.Y_METRICS
            ],
            ("cache.png", lambda: plots.cache_figure(df, out / "cache.png")),
            ("hit_rates.png", lambda: plots.hit_rate_figure(df, out / "hit_rates.png")),
            ("energy.png", lambda: plots.energy_figure(df, out / "energy.png")),
            ("routing.png", lambda: plots.routing_figure(df, out / "routing.png")),
        ]
        figures[0][1]()  # the first draw pays matplotlib's font cache: not counted
        total = 0.0
        print(f"{len(df)} cells, {len(df.columns)} columns; median CPU of {args.runs} draws each:")
        for name, draw in figures:
            times = []
            for _ in range(args.runs):
                start = time.process_time()
                draw()
                times.append(time.process_time() - start)
            median = statistics.median(times)
            total += median
            print(f"  {name:40s} {median:6.2f} s")
        print(f"  {'all figures':40s} {total:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
