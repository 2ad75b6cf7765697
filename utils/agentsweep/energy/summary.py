"""The power summary of one cell: GPU energy over the replayer's measurement window, what it costs per
token and per request, and whether the measurement can be trusted (``power_valid``, its reasons and
the audit behind them).

Energy of each GPU over the window [start, end]:

- from its own energy counter when every sample of it has one (DCGM's total energy, amd-smi's
  accumulator, the simulated engine's counter): the counter at ``end`` minus the counter at
  ``start``, each read by linear interpolation between the samples around it;
- else by integrating its power over the window: the trapezoid rule over its samples, the power at
  each edge of the window read by interpolation between the samples around it (nvidia-smi has no
  energy counter).

The cell's energy is the sum over its GPUs. A simulated engine running S times faster than the wall
clock (``clock_scale``) lives S engine seconds per wall second: its counter already counts engine
time, and a power integral over wall time is multiplied by S, so both read in the engine's clock,
like every other figure of a simulated cell.

The measurement is valid when every one of the cell's GPUs has samples across the whole window
(no gap between samples, or between an edge and the nearest sample, longer than ``max_gap_s``), no
energy counter goes backwards, no GPU reads beyond what its hardware can draw (a sample's power, or
its average over the window, below 0 or above ``POWER_LIMIT_FACTOR`` times its board power), and the
sampler reported no fault during the window (or, when a GPU has no samples at all, before it). Otherwise ``power_valid`` is false, each reason names its
cause in one line, and every energy and power figure is withheld (None); the audit stays. The cell
itself is unaffected: an invalid power measurement never makes a performance point INVALID.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kv_cache_tester.replay import ResultError, Summary, load_summary
from kv_cache_tester.stats import percentile

from agentsweep.contract.cell import ENGINE_POWER_ENDPOINT, Cell
from agentsweep.contract.hardware import LEGACY_SIM_HARDWARE
from agentsweep.contract.resultdir import POWER_CSV, read_cell_record
from agentsweep.energy.powercsv import PowerCsvReader, PowerRow
from agentsweep.engine_sim.profiles import HARDWARE
from agentsweep.errors import ResultFileError

# The longest stretch of a window a GPU may go without a sample: this many sampling intervals, and
# never less than MIN_GAP_S (a loaded node delays a tool by a second now and then).
GAP_INTERVALS = 5
MIN_GAP_S = 2.0
MAX_REASONS = 8
# A GPU draws at most its board power (TDP) for longer than milliseconds, and a sampling tool's figure is
# an average over its interval, so a measured figure stays at or below the board power. One above this
# multiple of it is no measurement (an energy counter in mJ read as J, a field mistaken for another).
POWER_LIMIT_FACTOR = 1.5


@dataclass(frozen=True, slots=True)
class PowerLimit:
    """The most one GPU may read (W), and where the figure comes from (for the reason)."""

    watts: float
    basis: str


def power_limit(hardware: str) -> PowerLimit:
    """POWER_LIMIT_FACTOR x the board power of ``hardware`` (engine_sim.profiles.HARDWARE, each from
    its datasheet); a hardware not known there (a local runner names none): x the largest board power
    known."""
    known = HARDWARE.get(hardware)
    if known is not None:
        board, what = known.board_power_w, f"{hardware}'s {known.board_power_w:g} W board power"
    else:
        board = max(h.board_power_w for h in HARDWARE.values())
        what = f"the largest board power known, {board:g} W (hardware {hardware or 'not named'})"
    return PowerLimit(POWER_LIMIT_FACTOR * board, f"{POWER_LIMIT_FACTOR:g} x {what}")


# One code per check a measurement can fail (``PowerSummary.reason_codes``, beside the one-line
# reasons): lowercase words joined by "_", the form InferenceX's power contract gives its reasons
# (docs/energy.md lists them; the same code where InferenceX has one for the same failure).
NOT_SAMPLED = "power_not_sampled"
TELEMETRY_MISSING = "telemetry_file_missing"
TELEMETRY_UNREADABLE = "telemetry_file_unreadable"
WINDOW_MISSING = "profile_window_missing"
SAMPLER_FAULT = "sampler_fault"
NO_POWER = "no_usable_power_samples"
GPU_COUNT = "expected_gpu_count_mismatch"
GAP = "sampling_gap_exceeded"
COUNTER_BACKWARDS = "negative_delta_gpus"
BAD_ROWS = "invalid_power_sample"
OUT_OF_RANGE = "power_out_of_range"
REASON_CODES: tuple[str, ...] = (
    NOT_SAMPLED, TELEMETRY_MISSING, TELEMETRY_UNREADABLE, WINDOW_MISSING, SAMPLER_FAULT, NO_POWER,
    GPU_COUNT, GAP, COUNTER_BACKWARDS, BAD_ROWS, OUT_OF_RANGE,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Window:
    """The measurement window (Unix seconds, the replayer's) and how fast the engine's clock runs."""

    start_unix: float
    end_unix: float
    clock_scale: float = 1.0

    @property
    def wall_s(self) -> float:
        return self.end_unix - self.start_unix

    @property
    def engine_s(self) -> float:
        return self.wall_s * self.clock_scale


@dataclass(frozen=True, slots=True)
class Work:
    """What the cell delivered in the window: the denominators of the per-token and per-request figures."""

    output_tokens: float | None = None
    total_tokens: float | None = None
    ok_requests: float | None = None


@dataclass(frozen=True, slots=True)
class PowerAudit:
    """How the measurement was made; kept whether or not it is valid."""

    source: str  # dcgm | nvidia-smi | amd-smi | none (a simulated engine's: "dcgm (simulated engine)")
    window_start_unix: float | None
    window_end_unix: float | None
    window_s: float | None  # wall seconds
    clock_scale: float
    expected_gpus: int
    observed_gpus: int
    samples: int  # in the window, all GPUs
    largest_gap_s: float | None  # wall seconds, the window's edges included
    largest_gap_gpu: str
    max_gap_s: float
    energy_from: str  # "counter", "power integral", "mixed" or "" (no figure)
    faults: int  # fault rows of the sampler, all of them
    bad_rows: int  # unreadable rows of power.csv


@dataclass(frozen=True, slots=True)
class GpuPower:
    """One GPU's figures over the window."""

    node: str
    gpu: str
    samples: int
    energy_j: float | None
    energy_from: str
    avg_power_w: float | None
    p90_power_w: float | None
    avg_temp_c: float | None
    peak_temp_c: float | None
    avg_util_pct: float | None


@dataclass(frozen=True, slots=True)
class PowerSummary:
    """The cell's power figures (None when ``power_valid`` is false), the reasons and the audit.

    ``avg_power_w`` and ``p90_power_w`` are the whole cell's (every GPU summed); per GPU they are in
    ``per_gpu`` and ``avg_power_per_gpu_w``. Energy is in the engine's clock (see the module docstring).
    """

    power_valid: bool
    avg_power_w: float | None
    p90_power_w: float | None
    avg_power_per_gpu_w: float | None
    total_gpu_energy_j: float | None
    joules_per_output_token: float | None
    joules_per_total_token: float | None
    joules_per_successful_query: float | None
    avg_temp_c: float | None
    peak_temp_c: float | None
    avg_util_pct: float | None
    reasons: tuple[str, ...]
    audit: PowerAudit
    per_gpu: tuple[GpuPower, ...] = field(default=())
    reason_codes: tuple[str, ...] = field(default=())  # one code per reason, in the same order

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (reasons as a list, the audit and per-GPU figures nested)."""
        out = asdict(self)
        out["reasons"] = list(self.reasons)
        out["reason_codes"] = list(self.reason_codes)
        out["per_gpu"] = [asdict(g) for g in self.per_gpu]
        return out


class _Series:
    """One GPU's samples around and inside the window, in time order."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.power: list[float | None] = []
        self.energy: list[float | None] = []
        self.temp: list[float | None] = []
        self.util: list[float | None] = []

    def add(self, row: PowerRow) -> None:
        self.t.append(row.time_s)
        self.power.append(row.power_w)
        self.energy.append(row.energy_j)
        self.temp.append(row.temp_c)
        self.util.append(row.util_pct)

    def sort(self) -> None:
        order = sorted(range(len(self.t)), key=self.t.__getitem__)
        for name in ("t", "power", "energy", "temp", "util"):
            values = getattr(self, name)
            setattr(self, name, [values[i] for i in order])

    def span(self, start: float, end: float) -> range:
        """The samples inside the window plus the nearest one on each side."""
        return range(max(bisect_left(self.t, start) - 1, 0), min(bisect_left(self.t, end) + 1, len(self.t)))

    def inside(self, start: float, end: float) -> range:
        return range(bisect_left(self.t, start), bisect_right(self.t, end))


def _at(t: list[float], v: list[float], when: float) -> float:
    """``v`` at ``when`` by linear interpolation (the nearest value outside the points)."""
    i = bisect_left(t, when)
    if i < len(t) and t[i] == when:
        return v[i]
    if i == 0:
        return v[0]
    if i == len(t):
        return v[-1]
    return v[i - 1] + (v[i] - v[i - 1]) * (when - t[i - 1]) / (t[i] - t[i - 1])


def integrate(times: list[float], watts: list[float], start: float, end: float) -> float:
    """Joules (W x s of the same clock as ``times``) over [start, end]: the trapezoid rule over the
    samples inside, the power at each edge interpolated between the samples around it."""
    if not times or end <= start:
        return 0.0
    inner = [(t, w) for t, w in zip(times, watts, strict=True) if start < t < end]
    points = [(start, _at(times, watts, start)), *inner, (end, _at(times, watts, end))]
    return math.fsum((b[0] - a[0]) * (a[1] + b[1]) / 2.0 for a, b in itertools.pairwise(points))


def _mean(values: Iterable[float | None]) -> float | None:
    data = [v for v in values if v is not None]
    return math.fsum(data) / len(data) if data else None


class _Reasons:
    """The failed checks so far: one line and one code each, at most MAX_REASONS."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.codes: list[str] = []

    def add(self, code: str, text: str) -> None:
        if len(self.lines) < MAX_REASONS:
            self.lines.append(text)
            self.codes.append(code)

    def __bool__(self) -> bool:
        return bool(self.lines)


def summarize(
    rows: Iterable[PowerRow],
    *,
    window: Window | None,
    expected_gpus: int,
    interval_s: float,
    work: Work,
    source: str,
    bad_rows: int = 0,
    unusable: str | None = None,
    unusable_code: str = WINDOW_MISSING,
    limit: PowerLimit | None = None,
) -> PowerSummary:
    """The power summary of ``rows`` (power.csv's rows, in any order); see the module docstring.

    ``unusable``: a reason the measurement cannot be used whatever the rows hold (no window, no
    sampler), and ``unusable_code`` its code; ``bad_rows``: unreadable rows of the file, reported in
    the audit; ``limit``: the most one GPU may read (default: that of a hardware not named,
    ``power_limit("")``).
    """
    limit = limit or power_limit("")
    max_gap = max(GAP_INTERVALS * interval_s, MIN_GAP_S)
    series: dict[tuple[str, str], _Series] = {}
    faults: list[PowerRow] = []
    for row in rows:
        if row.fault:
            faults.append(row)
        elif row.power_w is not None or row.energy_j is not None:
            series.setdefault(row.key, _Series()).add(row)
        else:  # a GPU that answers but reports no power ([N/A]): it is there, and unmeasured
            series.setdefault(row.key, _Series())
    reasons = _Reasons()
    if unusable:
        reasons.add(unusable_code, unusable)
    if window is None:
        if not reasons:
            reasons.add(WINDOW_MISSING, "no measurement window (summary.json has none)")
        return _withheld(reasons, source, None, expected_gpus, 0, None, "", max_gap, faults, bad_rows)
    start, end = window.start_unix, window.end_unix

    faults.sort(key=lambda r: r.time_s)
    during = [f for f in faults if start - max_gap <= f.time_s <= end + max_gap]
    for fault in during[:1]:
        more = f" (and {len(during) - 1} more faults)" if len(during) > 1 else ""
        reasons.add(
            SAMPLER_FAULT,
            f"power sampler at {fault.time_s - start:+.1f} s of the window: {fault.fault}{more}",
        )

    observed: list[tuple[str, str]] = []
    samples = 0
    gap, gap_gpu = 0.0, ""
    for key in sorted(series):
        s = series[key]
        s.sort()
        name = "/".join(key)
        inside = s.inside(start, end)
        powered = [i for i in inside if s.power[i] is not None or s.energy[i] is not None]
        samples += len(powered)
        if not powered:
            if not s.t or all(p is None for p in s.power):
                reasons.add(NO_POWER, f"GPU {name} reports no power")
            continue
        observed.append(key)
        beyond = next(
            (i for i in powered if (w := s.power[i]) is not None and not 0 <= w <= limit.watts), None
        )
        if beyond is not None:
            reasons.add(
                OUT_OF_RANGE,
                f"GPU {name} reads {s.power[beyond]:.6g} W at {s.t[beyond] - start:+.1f} s of the window, "
                f"outside 0..{limit.watts:g} W ({limit.basis}): not a measurement",
            )
        edges = [start, *(s.t[i] for i in powered), end]
        for a, b in itertools.pairwise(edges):
            if b - a > gap:
                gap, gap_gpu = b - a, name
        energies = [(s.t[i], s.energy[i]) for i in s.span(start, end) if s.energy[i] is not None]
        for (_t0, e0), (t1, e1) in itertools.pairwise(energies):
            assert e0 is not None and e1 is not None
            if e1 < e0:
                reasons.add(
                    COUNTER_BACKWARDS,
                    f"energy counter of GPU {name} went backwards at {t1 - start:+.1f} s of the window "
                    f"({e0:.6g} J -> {e1:.6g} J)",
                )
                break
    if not observed and not during and faults:  # nothing measured: the last fault before says why
        cause = [f for f in faults if f.time_s < start] or faults
        reasons.add(SAMPLER_FAULT, f"power sampler: {cause[-1].fault}")
    if len(observed) < expected_gpus:
        names = ", ".join("/".join(k) for k in observed) or "none"
        reasons.add(
            GPU_COUNT,
            f"power samples of {len(observed)} of the cell's {expected_gpus} GPUs in the window ({names})",
        )
    elif len(observed) > expected_gpus:
        reasons.add(GPU_COUNT, f"power samples of {len(observed)} GPUs, but the cell has {expected_gpus}")
    if observed and gap > max_gap:
        reasons.add(
            GAP,
            f"largest gap between power samples is {gap:.2f} s (GPU {gap_gpu}; at most {max_gap:g} s)",
        )
    if bad_rows:
        reasons.add(BAD_ROWS, f"{POWER_CSV}: {bad_rows} unreadable rows")

    def withheld() -> PowerSummary:  # the figures withheld, the audit kept: one call for both checks
        return _withheld(
            reasons, source, window, expected_gpus, len(observed), gap, gap_gpu, max_gap, faults, bad_rows,
            samples,
        )  # fmt: skip

    if reasons:
        return withheld()
    per_gpu = [_gpu_figures(key, series[key], window, interval_s) for key in observed]
    for g in per_gpu:  # an energy counter in the wrong unit shows only in its average
        if g.avg_power_w is not None and not 0 <= g.avg_power_w <= limit.watts:
            reasons.add(
                OUT_OF_RANGE,
                f"GPU {g.node}/{g.gpu} averages {g.avg_power_w:.6g} W over the window ({g.energy_from}), "
                f"outside 0..{limit.watts:g} W ({limit.basis}): not a measurement",
            )
    if reasons:
        return withheld()
    return _valid(
        per_gpu,
        series,
        observed,
        window,
        work,
        interval_s,
        expected_gpus,
        gap,
        gap_gpu,
        max_gap,
        source,
        len(faults),
        bad_rows,
        samples,
    )


def _gpu_figures(key: tuple[str, str], s: _Series, window: Window, step: float) -> GpuPower:
    start, end = window.start_unix, window.end_unix
    around = s.span(start, end)
    inside = s.inside(start, end)
    counter = [(s.t[i], j) for i in around if (j := s.energy[i]) is not None]
    if len(counter) == len(around) and len(counter) >= 2:
        times, joules = [c[0] for c in counter], [c[1] for c in counter]
        energy = _at(times, joules, end) - _at(times, joules, start)
        source = "counter"
    else:
        powered = [(s.t[i], w) for i in around if (w := s.power[i]) is not None]
        energy = integrate([p[0] for p in powered], [p[1] for p in powered], start, end) * window.clock_scale
        source = "power integral"
    temps = [c for i in inside if (c := s.temp[i]) is not None]
    return GpuPower(
        node=key[0],
        gpu=key[1],
        samples=len(inside),
        energy_j=energy,
        energy_from=source,
        avg_power_w=energy / window.engine_s if window.engine_s > 0 else None,
        p90_power_w=_p90_over_time([s], window, step),
        avg_temp_c=_mean(temps),
        peak_temp_c=max(temps) if temps else None,
        avg_util_pct=_mean(s.util[i] for i in inside),
    )


def _p90_over_time(series: list[_Series], window: Window, step: float) -> float | None:
    """p90 over the window of the summed power of ``series`` (each interpolated on a grid ``step`` apart,
    so a GPU sampled more often weighs no more, and one GPU reads the same alone or in a cell)."""
    n = max(2, min(100_000, int(window.wall_s / step) + 1))
    grid = [window.start_unix + window.wall_s * k / (n - 1) for k in range(n)]
    total = [0.0] * n
    for s in series:
        powered = [(t, p) for t, p in zip(s.t, s.power, strict=True) if p is not None]
        if not powered:
            return None
        t, w = [p[0] for p in powered], [p[1] for p in powered]
        for k, when in enumerate(grid):
            total[k] += _at(t, w, when)
    return percentile(sorted(total), 90.0)


def _valid(
    per_gpu: list[GpuPower],
    series: dict[tuple[str, str], _Series],
    keys: list[tuple[str, str]],
    window: Window,
    work: Work,
    interval_s: float,
    expected: int,
    gap: float,
    gap_gpu: str,
    max_gap: float,
    source: str,
    faults: int,
    bad_rows: int,
    samples: int,
) -> PowerSummary:
    energy = math.fsum(g.energy_j or 0.0 for g in per_gpu)
    kinds = {g.energy_from for g in per_gpu}
    energy_from = kinds.pop() if len(kinds) == 1 else "mixed"
    engine_s = window.engine_s
    avg = energy / engine_s if engine_s > 0 else None
    inside = [(s, s.inside(window.start_unix, window.end_unix)) for s in (series[k] for k in keys)]
    all_temps = [c for s, r in inside for i in r if (c := s.temp[i]) is not None]
    utils = [u for s, r in inside for i in r if (u := s.util[i]) is not None]

    def per(count: float | None) -> float | None:
        return energy / count if count else None

    return PowerSummary(
        power_valid=True,
        avg_power_w=avg,
        p90_power_w=_p90_over_time([series[k] for k in keys], window, interval_s),
        avg_power_per_gpu_w=avg / len(per_gpu) if avg is not None and per_gpu else None,
        total_gpu_energy_j=energy,
        joules_per_output_token=per(work.output_tokens),
        joules_per_total_token=per(work.total_tokens),
        joules_per_successful_query=per(work.ok_requests),
        avg_temp_c=_mean(all_temps),
        peak_temp_c=max(all_temps) if all_temps else None,
        avg_util_pct=_mean(utils),
        reasons=(),
        audit=PowerAudit(
            source,
            window.start_unix,
            window.end_unix,
            window.wall_s,
            window.clock_scale,
            expected,
            len(keys),
            samples,
            gap,
            gap_gpu,
            max_gap,
            energy_from,
            faults,
            bad_rows,
        ),
        per_gpu=tuple(per_gpu),
    )


def _withheld(
    reasons: _Reasons,
    source: str,
    window: Window | None,
    expected: int,
    observed: int,
    gap: float | None,
    gap_gpu: str,
    max_gap: float,
    faults: list[PowerRow],
    bad_rows: int,
    samples: int = 0,
) -> PowerSummary:
    audit = PowerAudit(
        source,
        window.start_unix if window else None,
        window.end_unix if window else None,
        window.wall_s if window else None,
        window.clock_scale if window else 1.0,
        expected,
        observed,
        samples,
        gap if observed else None,
        gap_gpu,
        max_gap,
        "",
        len(faults),
        bad_rows,
    )
    none = None
    return PowerSummary(
        False, none, none, none, none, none, none, none, none, none, none, tuple(reasons.lines), audit,
        reason_codes=tuple(reasons.codes),
    )  # fmt: skip


# -- reading a result directory ---------------------------------------------------------------------


def effective_source(cell: Cell, simulated: bool) -> str:
    """The source a cell's sampler reads: a simulated engine is sampled through its own DCGM metrics."""
    if cell.node.power_source == "none":
        return "none"
    if simulated or (cell.node.power_source == "dcgm" and cell.node.power_endpoint == ENGINE_POWER_ENDPOINT):
        return "dcgm (engine)" if not simulated else "dcgm (simulated engine)"
    return cell.node.power_source


def power_summary(result_dir: Path) -> PowerSummary:
    """The power summary of a cell's result directory (cell.json, summary.json, power.csv).

    Never raises for what summary.json or power.csv hold: a missing or broken file is a reason
    (``power_valid`` false); ``ResultFileError`` only when cell.json itself is missing or broken.
    """
    record = read_cell_record(result_dir)
    if record is None:
        raise ResultFileError("cell.json missing")
    return cell_power_summary(result_dir, record.parse_cell())


def cell_power_summary(result_dir: Path, cell: Cell, summary: Summary | None = None) -> PowerSummary:
    """``power_summary`` for a cell known already: the cell itself, before it writes cell.json, or a
    reader of its ``CellResult``, which passes the summary.json read there (with its window, as
    ``load_summary`` requires it by default); read here when not given."""
    source = effective_source(cell, cell.engine == "sim")
    window, work, problem = _window_and_work(result_dir, cell, summary)
    path = result_dir / POWER_CSV
    # The simulated engine draws as the hardware it models (a result from before cells stated one: H200).
    hardware = cell.node.hardware or (LEGACY_SIM_HARDWARE if cell.engine == "sim" else "")
    args: dict[str, Any] = {
        "window": window, "expected_gpus": cell.gpus, "interval_s": cell.node.power_interval_s, "work": work,
        "source": source, "limit": power_limit(hardware),
    }  # fmt: skip
    if source == "none":
        return summarize(
            (), unusable=f"runner {cell.runner} samples no power (power_source none)", unusable_code=NOT_SAMPLED,
            **args,
        )  # fmt: skip
    if not path.exists() and not path.is_symlink():
        return summarize(
            (), unusable=f"{POWER_CSV} missing: the power sampler wrote nothing", unusable_code=TELEMETRY_MISSING,
            **args,
        )  # fmt: skip
    reader = PowerCsvReader(path)
    try:
        rows = list(reader)
    except ResultFileError as err:
        return summarize((), unusable=str(err), unusable_code=TELEMETRY_UNREADABLE, **args)
    return summarize(rows, bad_rows=reader.bad_rows, unusable=problem, **args)


def _window_and_work(
    result_dir: Path, cell: Cell, summary: Summary | None
) -> tuple[Window | None, Work, str | None]:
    """The replayer's window and what it delivered in it, from summary.json, read here unless given
    (None and why when absent)."""
    if summary is None:
        try:
            summary = load_summary(result_dir, required=("window", "window.start_unix", "window.end_unix"))
        except ResultError as err:
            return None, Work(), str(err)
    win = summary["window"]
    duration = win.get("duration_s") or (win["end_unix"] - win["start_unix"])
    window = Window(win["start_unix"], win["end_unix"], cell.speed)  # speed is 1 but for the simulated engine
    tput: dict[str, Any] = dict(summary.get("throughput") or {})

    def count(rate_key: str) -> float | None:
        rate = tput.get(rate_key)
        return rate * duration if isinstance(rate, int | float) and duration else None

    return window, Work(count("output_tok_per_s"), count("total_tok_per_s"), count("requests_per_s")), None
