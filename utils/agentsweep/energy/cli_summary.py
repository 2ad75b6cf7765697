"""`agentsweep power-summary`: the power summary of a cell's result directory, or of a bare power.csv
over a window given by hand (a probe on a GPU machine)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from agentsweep.energy.cli_sampler import interval
from agentsweep.energy.powercsv import PowerCsvReader
from agentsweep.energy.summary import PowerSummary, Window, Work, power_summary, summarize
from agentsweep.errors import InputError, ResultFileError


def unix_seconds(text: str) -> float:
    """An argparse type: a finite instant in Unix seconds (nan or inf would make no window)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite time in Unix seconds, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("result_dir", nargs="?", type=Path, help="a cell's result directory")
    parser.add_argument("--power-csv", type=Path, help="instead: a bare power.csv ...")
    parser.add_argument("--start", type=unix_seconds, help="... the window's start (Unix seconds)")
    parser.add_argument("--end", type=unix_seconds, help="... and end (Unix seconds)")
    parser.add_argument(
        "--expected-gpus", type=int, default=1, help="... the GPUs it should hold (default 1)"
    )
    parser.add_argument(
        "--interval", type=interval, default=0.5, help="... its sampling interval (default 0.5)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    if (args.result_dir is None) == (args.power_csv is None):
        raise InputError("power-summary: give a result directory or --power-csv (with --start and --end)")
    if args.result_dir is not None:
        if not args.result_dir.is_dir():
            raise InputError(f"{args.result_dir}: not a directory")
        summary = power_summary(args.result_dir)
    else:
        if args.start is None or args.end is None or args.end <= args.start:
            raise InputError(
                "power-summary --power-csv: give --start and --end (Unix seconds, end after start)"
            )
        if args.expected_gpus < 1:
            raise InputError(f"--expected-gpus: must be at least 1, got {args.expected_gpus}")
        reader = PowerCsvReader(args.power_csv)
        try:
            rows = list(reader)
        except ResultFileError as err:
            raise InputError(str(err)) from None
        summary = summarize(
            rows,
            window=Window(args.start, args.end),
            expected_gpus=args.expected_gpus,
            interval_s=args.interval,
            work=Work(),
            source="power.csv",
            bad_rows=reader.bad_rows,
        )
    print(json.dumps(summary.to_dict(), indent=2) if args.json else describe(summary))
    return 0


def describe(summary: PowerSummary) -> str:
    """Human lines: the verdict, the figures (or why they are withheld) and the audit."""
    a = summary.audit
    lines = [f"power_valid: {str(summary.power_valid).lower()}"]
    lines += [f"  reason: {r}" for r in summary.reasons]
    if summary.power_valid:
        lines.append(
            f"energy {summary.total_gpu_energy_j:.1f} J ({a.energy_from}); average power {summary.avg_power_w:.1f} W "
            f"(p90 {summary.p90_power_w or 0:.1f} W) for the cell, {summary.avg_power_per_gpu_w:.1f} W per GPU"
        )
        for name in ("joules_per_output_token", "joules_per_total_token", "joules_per_successful_query"):
            value = getattr(summary, name)
            if value is not None:
                lines.append(f"{name}: {value:.4g}")
        for g in summary.per_gpu:
            lines.append(
                f"  {g.node} GPU {g.gpu}: {g.samples} samples, {g.energy_j:.1f} J, avg {g.avg_power_w:.1f} W, "
                f"p90 {g.p90_power_w or 0:.1f} W, temp avg {_num(g.avg_temp_c)} peak {_num(g.peak_temp_c)} °C, "
                f"util {_num(g.avg_util_pct)} %"
            )
    window = f"{a.window_s:.1f} s" if a.window_s is not None else "none"
    gap = f"{a.largest_gap_s:.2f} s" if a.largest_gap_s is not None else "n/a"
    lines.append(
        f"audit: source {a.source}, window {window} (clock x{a.clock_scale:g}), GPUs {a.observed_gpus} of "
        f"{a.expected_gpus}, {a.samples} samples, largest gap {gap} (limit {a.max_gap_s:g} s), "
        f"{a.faults} faults, {a.bad_rows} bad rows"
    )
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
