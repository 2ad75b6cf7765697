"""``python -m agentsweep.experimental.aiperf run-cell|convert|prepare ...``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from agentsweep.errors import AgentsweepError, InputError


def _cell_from(args: argparse.Namespace) -> dict[str, Any]:
    """The matrix cell from --cell (JSON or @FILE), else from the launcher's $AGENTSWEEP_CELL."""
    from agentsweep.contract.cell import CELL_ENV_VAR, Cell

    if args.cell:
        cell = Cell.load(args.cell)
    else:
        raw = os.environ.get(CELL_ENV_VAR, "")
        if not raw.strip():
            raise InputError(f"no cell: pass --cell JSON or set ${CELL_ENV_VAR}")
        cell = Cell.parse(raw, where=f"${CELL_ENV_VAR}")
    return {**cell.model_dump(mode="json"), "client": "aiperf"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentsweep.experimental.aiperf", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    rc = sub.add_parser("run-cell", help="run aiperf profile for one cell against a running engine")
    rc.add_argument("--endpoint", required=True, help="engine base URL, http://HOST:PORT")
    rc.add_argument("--output-dir", type=Path, required=True, help="the cell's result directory")
    rc.add_argument("--cell", help="the matrix cell as a JSON object (default: from the environment)")
    rc.add_argument("--metrics-path", default="/metrics", help="engine metrics path ('' = none)")
    rc.add_argument("--format", default="auto", choices=("auto", "weka", "mooncake"), help="trace input")
    rc.add_argument("--no-install", action="store_true", help="fail instead of creating the venv")
    cv = sub.add_parser("convert", help="AIPerf artifact dir -> requests.jsonl + summary.json")
    cv.add_argument("artifact_dir", type=Path)
    cv.add_argument("--output-dir", type=Path, required=True)
    cv.add_argument("--traces", help="the traces AIPerf ran (for theoretical hits and expected sizes)")
    cv.add_argument("--users", type=int, default=1)
    mx = sub.add_parser(
        "cells", help="run matrix cells locally with the aiperf client (engine, scraper, aiperf)"
    )
    mx.add_argument("matrix", type=Path, help="`agentsweep matrix --json` output")
    mx.add_argument("--results", type=Path, required=True, help="results folder (one dir per cell)")
    pr = sub.add_parser("prepare", help="write our traces as AIPerf input (weka or mooncake_trace)")
    pr.add_argument("traces")
    pr.add_argument("--output-dir", type=Path, required=True)
    pr.add_argument("--format", default="auto", choices=("auto", "weka", "mooncake"))
    pr.add_argument("--time-scale", type=float, default=1.0)
    pr.add_argument("--max-delay", type=float)
    pr.add_argument("--max-context", type=int)
    args = p.parse_args(argv)
    try:
        if args.cmd == "run-cell":
            from agentsweep.experimental.aiperf.cell import run_aiperf_cell

            return run_aiperf_cell(
                _cell_from(args),
                args.endpoint,
                args.output_dir,
                metrics_path=args.metrics_path or None,
                install=not args.no_install,
                trace_format=args.format,
            )
        if args.cmd == "cells":
            from agentsweep.contract.resultdir import read_matrix
            from agentsweep.experimental.aiperf.matrix import run_cells

            failed = run_cells(read_matrix(args.matrix), args.results)
            return 1 if failed else 0
        from agentsweep.experimental.aiperf.traces import prepare_input

        if args.cmd == "convert":
            import tempfile

            from agentsweep.experimental.aiperf.exports import write_outputs

            with tempfile.TemporaryDirectory() as tmp:
                prepared = prepare_input(args.traces, Path(tmp)) if args.traces else None
                summary = write_outputs(
                    args.artifact_dir,
                    args.output_dir,
                    prepared,
                    users=args.users,
                    options={"client": "aiperf"},
                )
            print(f"{summary['counts']['ok']} ok, {summary['counts']['failed']} failed -> {args.output_dir}")
            return 0
        prepared = prepare_input(
            args.traces,
            args.output_dir,
            time_scale=args.time_scale,
            max_delay=args.max_delay,
            max_context=args.max_context,
            fmt=args.format,
        )
        print(
            f"{prepared.traces} traces, {prepared.requests} requests -> {prepared.path} ({prepared.dataset_type})"
        )
        return 0
    except AgentsweepError as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
