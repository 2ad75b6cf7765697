"""Cache pytest's rewritten test modules once, on every core, before the xdist workers start.

pytest rewrites each test module's asserts when it imports it and caches the result beside it
(``__pycache__/<module>.<tag>-pytest-<version>.pyc``). On a fresh clone nothing is cached, and every
xdist worker collects the whole suite at once, so every worker rewrites every module: about 10 s of
CPU a worker for this suite (measured: a cold ``--collect-only`` 15 s, a warm one 4.5 s), six workers
on two cores. This finds the test modules without a fresh cache and collects them once, split over
the machine's cores, so that the workers find them cached. With the cache fresh it starts nothing.

    python tests/support/warm_rewrite_cache.py   # make test and make test-fast run it first

A module that fails to import is left to the test run itself to report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = (REPO / "tests", REPO / "kv-cache-tester" / "tests")


def stale_modules(roots: tuple[Path, ...] = ROOTS) -> list[Path]:
    """Test modules whose rewritten bytecode is missing or older than their source."""
    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}"
    stale = []
    for root in roots:
        for path in sorted(root.rglob("test_*.py")):
            cached = path.parent / "__pycache__" / f"{path.stem}.{tag}.pyc"
            try:
                if cached.stat().st_mtime >= path.stat().st_mtime:
                    continue
            except FileNotFoundError:
                pass
            stale.append(path)
    return stale


def shares(paths: list[Path], count: int) -> list[list[Path]]:
    """``paths`` in ``count`` shares of about equal size in bytes (largest first, each to the lightest)."""
    out: list[list[Path]] = [[] for _ in range(max(1, count))]
    load = [0] * len(out)
    sizes = {path: path.stat().st_size for path in paths}
    for path in sorted(paths, key=sizes.__getitem__, reverse=True):
        lightest = load.index(min(load))
        out[lightest].append(path)
        load[lightest] += sizes[path]
    return [share for share in out if share]


def main() -> int:
    stale = stale_modules()
    if not stale or sys.dont_write_bytecode:
        return 0
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    procs = [
        subprocess.Popen(
            [*command, *map(str, share)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for share in shares(stale, len(os.sched_getaffinity(0)))  # the cores it may use, as nproc says
    ]
    for proc in procs:
        proc.wait()
    print(f"warm_rewrite_cache: {len(stale)} test modules rewritten and cached on {len(procs)} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
