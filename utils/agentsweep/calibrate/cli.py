"""`agentsweep calibrate`: the simulated engine against published serving points.

agentsweep calibrate [--points CSV] [--out DIR] [--seconds S]
    runs every row through the real path (engine-sim + kv-cache-tester replay, a closed loop of
    `conc` users), writes DIR/calibration.csv and DIR/parity.png, prints one line per row and
    the median absolute error of each measure.
agentsweep calibrate --fit [--points CSV] [--out DIR] [--write FILE]
    fits the step model's coefficients to the points (closed-loop stand-in, fast), prints the
    fit and leave-one-out errors and writes the calibration data file (default: the engine's).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from agentsweep.calibrate.points import DEFAULT_POINTS, MODEL_NAME, Point, read_points
from agentsweep.engine_sim import profiles
from agentsweep.errors import InputError

if TYPE_CHECKING:
    from agentsweep.calibrate.fit import FitResult
    from agentsweep.calibrate.run import RowResult

Pair = tuple[Point, Sequence[float]]  # a point and its predicted (tput/GPU, interactivity, TTFT)

# The published measures (engine_sim.profiles.MEASURES, calibration.json's order) and their labels.
MEASURES = tuple(zip(profiles.MEASURES, ("tput/GPU", "intvty", "TTFT"), strict=True))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--points", type=Path, default=DEFAULT_POINTS, help="published points (CSV; default: shipped set)"
    )
    p.add_argument(
        "-o",
        "--output",
        "--out",
        dest="out",
        type=Path,
        default=Path("calibration_out"),
        help="output directory",
    )
    p.add_argument("--seconds", type=float, default=12.0, help="wall seconds of replay per row")
    p.add_argument("--rows", default=None, help="only these CSV line numbers (comma separated)")
    p.add_argument("--fit", action="store_true", help="fit the coefficients instead of running the rows")
    p.add_argument(
        "--write",
        type=Path,
        default=None,
        help="with --fit: calibration file to write (default: the engine's)",
    )
    p.add_argument("--no-loo", action="store_true", help="with --fit: skip the leave-one-out refits")


SINGLE_USER = "1-user"  # the error table's line of the points served to one user


def _medians(rows: Sequence[tuple[Point, Sequence[float]]]) -> list[float]:
    return profiles.median_errors((pred, [getattr(p, col) for col, _ in MEASURES]) for p, pred in rows)


def error_table(rows: Sequence[tuple[Point, Sequence[float]]]) -> list[str]:
    """Median absolute error per measure, as printable lines: per hardware and precision (the engine
    versions of one together), per hardware, the single-user points (their TTFT is prefill latency
    alone, no queue) where there are some, then over all."""
    lines = []
    pairs = sorted({(p.hardware, p.precision) for p, _ in rows})
    hardware = sorted({hw for hw, _ in pairs})
    single = [SINGLE_USER] if any(p.conc == 1 for p, _ in rows) else []
    for key in [*(f"{hw}/{prec}" for hw, prec in pairs), *hardware, *single, "all"]:
        sel = [
            (p, v)
            for p, v in rows
            if key in ("all", p.hardware, f"{p.hardware}/{p.precision}")
            or (key == SINGLE_USER and p.conc == 1)
        ]
        med = _medians(sel)
        lines.append(
            f"  {key:<11} {len(sel):>3} points  "
            + "  ".join(f"{name} {100 * m:5.1f}%" for (_, name), m in zip(MEASURES, med, strict=True))
        )
    return lines


def _select(points: list[Point], rows: str | None) -> list[Point]:
    if not rows:
        return points
    try:
        wanted = {int(x) for x in rows.split(",") if x.strip()}
    except ValueError:
        raise InputError(f"--rows {rows!r}: expected comma-separated CSV line numbers") from None
    chosen = [p for p in points if p.line in wanted]
    unknown = wanted - {p.line for p in chosen}
    if unknown:
        raise InputError(f"--rows: no data row on line(s) {', '.join(map(str, sorted(unknown)))}")
    return chosen


def run(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.seconds) and args.seconds >= 2):
        raise InputError(f"--seconds {args.seconds}: must be at least 2")
    columns, points = read_points(args.points)
    points = _select(points, args.rows)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"--out {args.out}: {err.strerror or err}") from None
    if args.fit:
        return _fit(args, points)
    return _run_rows(args, columns, points)


EXTRA_COLUMNS = [
    "pred_tput_per_gpu", "pred_median_intvty", "pred_median_ttft_s", "status", "reason", "calibration",
    "requests", "preemptions", "speed", "late_steps_pct", "late_ms", "client_tput_per_gpu",
]  # fmt: skip


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached calibrate: handled like Ctrl-C (the row's engine is stopped)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# The signal received, kept beside the exception raised for it: Python drops an exception raised
# where it cannot propagate (a handler run inside an at-fork callback, as starting a row's replayer
# does, or a __del__), and the rows loop must stop all the same.
_RECEIVED: list[int] = []


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Once: a second signal while the row's engine is being stopped must not cut that short.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    _RECEIVED.append(signum)
    raise Stopped(signum)


def _raise_if_received() -> None:
    """Stopped for a signal whose exception was dropped where it was raised."""
    if _RECEIVED:
        raise Stopped(_RECEIVED[0])


def _run_rows(args: argparse.Namespace, columns: list[str], points: list[Point]) -> int:
    """Each row in turn, its line in calibration.csv written (and flushed) as soon as it is done, so
    SIGTERM, SIGINT or SIGHUP keep the rows finished: the row running is stopped (its engine and
    replayer with it), and the command exits 128 + the signal."""
    from agentsweep.calibrate.run import run_row

    t0 = time.monotonic()
    results: list[tuple[Point, RowResult]] = []
    out_csv = args.out / "calibration.csv"
    _RECEIVED.clear()
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        with out_csv.open("w", newline="") as fh, tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
            w = csv.writer(fh)
            w.writerow(columns + EXTRA_COLUMNS)
            fh.flush()
            for i, p in enumerate(points, start=1):
                res = run_row(p, args.seconds, Path(tmp))
                _raise_if_received()  # a row a signal reached is not kept, even if it ran on to its end
                results.append((p, res))
                w.writerow(_csv_row(columns, p, res))
                fh.flush()
                _say_row(i, len(points), p, res)
    except OSError as err:
        raise InputError(f"--out {out_csv}: cannot write: {err.strerror or err}") from None
    except KeyboardInterrupt as err:
        signum = err.signum if isinstance(err, Stopped) else signal.SIGINT
        print(
            f"calibrate: stopped by {signal.Signals(signum).name} after {len(results)} of {len(points)} "
            f"rows; {out_csv} holds them",
            file=sys.stderr,
            flush=True,
        )
        return 128 + signum
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    ok = [(p, (r.tput_per_gpu, r.median_intvty, r.median_ttft_s)) for p, r in results if r.status == "ok"]
    bad = [(p, r) for p, r in results if r.status != "ok"]
    print(f"median absolute error, real path ({len(ok)} of {len(results)} rows ran):")
    for line in error_table(ok):
        print(line)
    for p, r in bad:
        print(f"  not run: line {p.line} {p.label}: {r.status}: {r.reason}")
    wrote = [out_csv.name]
    if parity_plot(ok, args.out / "parity.png", "engine-sim + replay vs published"):
        wrote.append("parity.png")
    print(f"wrote {', '.join(wrote)} to {args.out} ({time.monotonic() - t0:.0f} s)")
    return 0 if not bad else 1


def _say_row(i: int, n: int, p: Point, res: RowResult) -> None:
    if res.status != "ok":
        print(f"[{i:>2}/{n}] {p.label:<38} {res.status.upper()}: {res.reason}", flush=True)
        return
    pred = (res.tput_per_gpu, res.median_intvty, res.median_ttft_s)
    parts = [
        f"{name} {v:.4g} vs {getattr(p, col):.4g} ({100 * (v / getattr(p, col) - 1):+.0f}%)"
        for (col, name), v in zip(MEASURES, pred, strict=True)
    ]
    late = f", {res.late_steps_pct:.0f}% steps late" if math.isfinite(res.late_steps_pct) else ""
    print(
        f"[{i:>2}/{n}] {p.label:<38} {'  '.join(parts)}  "
        f"[{res.requests} req, speed {res.speed:.3g}{late}, {res.wall_s:.0f}s]",
        flush=True,
    )


def _csv_row(columns: list[str], p: Point, r: RowResult) -> list[object]:
    from agentsweep.engine_sim.profiles import calibration_for

    cal = calibration_for(p.hardware, p.precision, p.generation)
    return (
        [p.row.get(c, "") for c in columns]
        + [_fmt(r.tput_per_gpu), _fmt(r.median_intvty), _fmt(r.median_ttft_s), r.status, r.reason]
        + [f"{cal.key} ({cal.points} points)" if cal.points else f"{cal.key} (defaults)"]
        + [r.requests, r.preemptions, f"{r.speed:.4g}", _fmt(r.late_steps_pct), _fmt(r.late_ms)]
        + [_fmt(r.client_tput_per_gpu)]
    )


def _fmt(x: float) -> str:
    return f"{x:.6g}" if math.isfinite(x) else ""


def parity_plot(rows: Sequence[tuple[Point, Sequence[float]]], path: Path, title: str) -> bool:
    """Predicted against measured, log-log, one colour per hardware, one panel per measure."""
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"h200": "tab:green", "b200": "tab:blue", "mi355x": "tab:red"}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6))
    for k, (ax, (col, name)) in enumerate(zip(axes, MEASURES, strict=True)):
        xs = [getattr(p, col) for p, _ in rows]
        ys = [v[k] for _, v in rows]
        vals = [v for v in xs + ys if math.isfinite(v) and v > 0]
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
        for f in (0.75, 1.25):
            ax.plot([lo, hi], [lo * f, hi * f], color="grey", lw=0.5, ls="--")
        for hw in sorted({p.hardware for p, _ in rows}):
            sel = [(getattr(p, col), v[k]) for p, v in rows if p.hardware == hw and math.isfinite(v[k])]
            ax.scatter([a for a, _ in sel], [b for _, b in sel], s=22, label=hw, color=colors.get(hw))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {name}")
        ax.set_ylabel(f"predicted {name}")
        med = _medians(rows)[k]
        ax.set_title(f"{name}: median |error| {100 * med:.1f}%")
        ax.legend(fontsize=8)
    fig.suptitle(title + " (dashed: +/-25%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _progress(t0: float) -> Callable[[str], None]:
    """Progress of a fit on stderr, with the seconds since it started (the fit takes minutes)."""

    def say(line: str) -> None:
        print(f"calibrate: {line} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)

    return say


def _fit(args: argparse.Namespace, points: list[Point]) -> int:
    from agentsweep.calibrate import fit as F
    from agentsweep.engine_sim.profiles import CALIBRATION_FILE, load_calibrations

    t0 = time.monotonic()
    # start from the shipped coefficients where there are some (the fit converges from anywhere
    # physical, only slower)
    cals = load_calibrations()
    start = (
        F.FitResult({k: c.efficiency for k, c in cals.items()}, next(iter(cals.values())).shared)
        if cals
        else None
    )
    res = F.fit(points, start=start, progress=_progress(t0))
    pairs = []
    for p in points:
        pr = F.predict(p, res.groups[p.group], res.shared)
        pairs.append((p, (pr.tput_per_gpu, pr.median_intvty, pr.median_ttft_s)))
    print(
        f"fitted {len(res.groups)} hardware x precision groups to {len(points)} points ({time.monotonic() - t0:.0f} s)"
    )
    for g, e in sorted(res.groups.items()):
        print(
            f"  {g:<11} step overhead {e.step_overhead_s * 1e3:.2f} ms, HBM {e.hbm_eff:.2f}, MFU {e.mfu:.2f}, "
            f"prefill step +{e.prefill_overhead_s * 1e3:.1f} ms, request +{e.request_overhead_s * 1e3:.1f} ms"
        )
    sh = res.shared
    print(
        f"  shared      {sh.per_seq_s * 1e6:.1f} us per decoding sequence, EP {sh.ep_layer_s * 1e6:.1f} us per MoE "
        f"layer, all-reduce {sh.allreduce_peer_s * 1e6:.2f} us per peer rank"
    )
    print("median absolute error of the fit (closed-loop stand-in):")
    fit_lines = error_table(pairs)
    for line in fit_lines:
        print(line)
    loo_lines: list[str] = []
    loo_pairs = []
    if not args.no_loo:
        for p, pr in F.leave_one_out(points, res, progress=_progress(t0)):
            loo_pairs.append((p, (pr.tput_per_gpu, pr.median_intvty, pr.median_ttft_s)))
        print("leave-one-out (each point predicted by its group refitted without it):")
        loo_lines = error_table(loo_pairs)
        for line in loo_lines:
            print(line)
    target = args.write or CALIBRATION_FILE
    data = calibration_document(args.points, points, res, pairs, loo_pairs)
    tmp = target.with_name(f".{target.name}.tmp")
    try:  # whole or not at all: the engine reads this file at every start
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise InputError(f"--write {target}: {err.strerror or err}") from None
    parity_plot(pairs, args.out / "parity_fit.png", "closed-loop stand-in vs published (fit)")
    print(f"wrote {target} and {args.out / 'parity_fit.png'}")
    return 0


def calibration_document(
    source: Path,
    points: Sequence[Point],
    res: FitResult,
    pairs: Sequence[Pair],
    loo_pairs: Sequence[Pair],
) -> dict[str, Any]:
    by_group: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        by_group.setdefault(p.group, []).append(i)
    keep = ("hardware", "framework", "precision", "isl", "osl", "tp", "ep", "conc", "tput_per_gpu",
            "median_intvty", "median_ttft_s", "date", "image", "run_url")  # fmt: skip
    groups = {}
    for g, idx in sorted(by_group.items()):
        pts = []
        for i in idx:
            p = points[i]
            entry: dict[str, Any] = {k: p.row.get(k, "") for k in keep if k in p.row}
            entry["fit_pred"] = [round(v, 6) for v in pairs[i][1]]
            if loo_pairs:
                entry["loo_pred"] = [round(v, 6) for v in loo_pairs[i][1]]
            pts.append(entry)
        images = sorted({points[i].row.get("image") or "unstated (2025)" for i in idx})
        groups[g] = {
            "model": "deepseek-r1",
            "images": images,
            "coefficients": {k: round(v, 9) for k, v in res.groups[g].to_dict().items()},
            "points": pts,
        }
    return {
        "format": 1,
        "about": "Step-model coefficients per hardware/precision, fitted by `agentsweep calibrate --fit` "
        "(see docs/engine-sim.md). Each group lists the published points it was fitted to (with their run "
        "URL), and the fit's and the leave-one-out prediction of (tput_per_gpu, median_intvty, median_ttft_s).",
        "source": f"{source.name}: InferenceX published results, {MODEL_NAME} on SGLang",
        "shared": res.shared.to_dict(),
        "groups": groups,
    }
