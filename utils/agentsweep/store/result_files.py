"""Every read of a cell result directory that the store and the dashboard make, in one module.

Each file is read through its owner (ARCHITECTURE.md §3, ``agentsweep.contract.resultdir.files``).
cell.json, status.txt, capacity.json, summary.json and router.json are read once, by collect
(``load_cell``): the point takes its verdict, figures and provenance from collect's row and what the
cell measured from the row's ``CellResult``, so the store and summary.csv read the same numbers. A
capacity.json beside a cell that is no capacity cell is read here through
``agentsweep.contract.resultdir``; requests.jsonl through ``kv_cache_tester.replay.results``
(``RecordReader``) where collect did not stream it; server_metrics*.csv and router_metrics.csv through
``agentsweep.metrics.scrapes.ScrapeReader``.

requests.jsonl is read once per point: collect's recount passes every record on to the drill-down's
timeline (``RequestTimeline``) as it goes. Everything the dashboard draws is taken from the files at
ingest into one drill-down payload per point (``drilldown``); the store also keeps the files
themselves (``KEPT``, compressed).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
from kv_cache_tester.inputfiles import InputFileProblem, open_regular
from kv_cache_tester.metrics import finite
from kv_cache_tester.replay import RecordReader, RequestRecord, ResultError, Summary
from kv_cache_tester.replay.jsonfast import dumps
from kv_cache_tester.replay.stability import MIN_SUBWINDOWS, subwindow_length

from agentsweep.capacity.measure import run_figures
from agentsweep.collect.aggregate import load_cell
from agentsweep.collect.discover import FoundCell, find_cells
from agentsweep.contract import columns
from agentsweep.contract.cell import RoleShape, shape_label
from agentsweep.contract.resultdir import (
    CAPACITY_JSON,
    CELL_JSON,
    PREFILL_METRICS_CSV,
    REQUESTS_JSONL,
    ROUTER_JSON,
    ROUTER_METRICS_CSV,
    SERVER_METRICS_CSV,
    SUMMARY_JSON,
    CapacityRecord,
    RouterRecord,
    instance_metrics_csv,
    read_capacity,
    result_file,
)
from agentsweep.contract.resultdir.fileio import exists
from agentsweep.contract.slo import DEFAULT_TIERS, distinct_constraints
from agentsweep.errors import InputError, ResultFileError
from agentsweep.metrics.scrapes import FIGURES, ScrapeReader

# The declared files kept whole (compressed) in the store beside the figures: the records, the
# scrapes, the router's counts, capacity results, the summary and the cell record.
KEPT = frozenset(
    result_file(name)
    for name in (
        REQUESTS_JSONL,
        SERVER_METRICS_CSV,
        PREFILL_METRICS_CSV,
        instance_metrics_csv("<instance>"),
        ROUTER_METRICS_CSV,
        ROUTER_JSON,
        CAPACITY_JSON,
        SUMMARY_JSON,
        CELL_JSON,
    )
)
# A drill-down shows every request up to this many; past it, every k-th (and says so).
DRILLDOWN_MAX_REQUESTS = 200_000
DRILLDOWN_VERSION = 1
# InferenceX's stability keys (issue 27's stability block) -> the store's metric names, with the
# power of the engine clock each is rescaled by (latencies x speed, interactivity / speed).
STABILITY_METRICS = {
    "ttft": ("ttft_{p}_s", 1),
    "e2el": ("e2e_{p}_s", 1),
    "intvty": ("interactivity_{p}_tok_per_s", -1),
}
STABILITY_STATS = ("p75", "p90")
_NAN = math.nan


@dataclass
class RequestTimeline:
    """The drill-down's per-request columns, filled one record at a time (``add``), in file order.

    A value absent from a record is NaN (the payload writes it as null); a record without a dispatch
    time is left out. ``warmup_end`` is the last warmup request's finish (run-start seconds).
    """

    t: array[float] = field(default_factory=lambda: array("d"))
    done: array[float] = field(default_factory=lambda: array("d"))
    ttft: array[float] = field(default_factory=lambda: array("d"))
    itl: array[float] = field(default_factory=lambda: array("d"))
    lane: array[int] = field(default_factory=lambda: array("l"))
    flags: array[int] = field(default_factory=lambda: array("b"))  # 1 ok, 2 warmup (bits)
    prompt_tokens: array[float] = field(default_factory=lambda: array("d"))  # for the throughput noise
    output_tokens: array[float] = field(default_factory=lambda: array("d"))
    warmup_end: float = 0.0

    def add(self, rec: RequestRecord) -> None:
        """Take one record (as the owner's reader gives it: every value present has its type)."""
        get = cast(dict[str, Any], rec).get
        t = get("t_dispatch")
        if t is None or t != t:  # absent, or NaN (a JSON reader without orjson takes the literal)
            return
        done = get("t_done")
        warm = get("phase") == "warmup"
        if warm and done is not None and done > self.warmup_end:
            self.warmup_end = done
        itl = get("itl_s")
        if itl is not None:  # the mean, or the median where a writer kept only that
            itl = itl.get("mean") if itl.get("mean") is not None else itl.get("p50")
        ttft = get("ttft_s")
        user = get("user")
        self.t.append(t)
        self.done.append(_NAN if done is None else done)
        self.ttft.append(_NAN if ttft is None else ttft)
        self.itl.append(_NAN if itl is None else itl)
        self.lane.append(-1 if user is None else user)
        self.flags.append((1 if get("status") == "ok" else 0) | (2 if warm else 0))
        prompt, output = get("prompt_tokens"), get("output_tokens")
        self.prompt_tokens.append(0.0 if prompt is None else float(prompt))
        self.output_tokens.append(0.0 if output is None else float(output))

    def __len__(self) -> int:
        return len(self.t)


@dataclass
class PointFacts:
    """What the store keeps of one result directory (besides its files)."""

    path: Path
    exp_name: str
    status: str  # SUCCESS | INVALID | FAILED
    reason: str
    notes: list[str]
    cell: dict[str, Any]  # cell.json's cell, as written
    hardware: str  # what it ran on, as collect names it ("simulated B300"; Cell.hardware_label)
    engine_version: str
    start_utc: str | None
    end_utc: str | None
    metrics: dict[str, float]  # collect's numeric columns (engine clock), finite values only
    labels: dict[str, str]  # collect's text columns (router policy, disaggregation shape, ...)
    validity: dict[str, Any]  # summary.json's validity (every check with value and limit); {} if none
    stability: dict[str, Any]  # summary.json's stability block; {} if none
    noise: dict[str, tuple[float, float]] = field(default_factory=dict)  # metric -> (min, max)
    # Throughput metric -> (low, high): its value ± 2 standard errors over the window's sub-windows.
    throughput_noise: dict[str, tuple[float, float]] = field(default_factory=dict)
    # The run as a grid of ordinary cells reads it against the default SLO tiers (collect.capacity):
    # {"statistics": {constraint key: value}, "output"/"total": tok/s per GPU, "kv_working_set",
    # "kv_pool"}; {} for a capacity cell and a FAILED one.
    slo_run: dict[str, Any] = field(default_factory=dict)
    requests: RequestTimeline = field(default_factory=RequestTimeline, repr=False)
    # A capacity cell's capacity.json as collect read and checked it (None for any other cell).
    capacity: CapacityRecord | None = field(default=None, repr=False)
    # router.json as collect read it (None without one), or why it breaks its contract.
    router: RouterRecord | None = field(default=None, repr=False)
    router_error: str | None = None

    @property
    def clock_scale(self) -> float:
        return self.metrics.get("clock_scale", 1.0)

    @property
    def shape(self) -> str:
        """The scale-out shape: ``p<n>x<tp>-d<n>x<tp>`` disaggregated, else ``r<replicas>``; ``@<n>n``
        when the cell spans several nodes."""
        roles = [self.cell.get("prefill"), self.cell.get("decode")]
        prefill, decode = (RoleShape.model_validate(r) if isinstance(r, dict) else None for r in roles)
        disagg = shape_label(prefill, decode)
        replicas = self.cell.get("replicas") or 1
        nodes = self.cell.get("nodes") or 1
        return (disagg or f"r{replicas}") + (f"@{nodes}n" if nodes != 1 else "")


def find_result_cells(root: Path) -> tuple[list[FoundCell], list[str]]:
    """Every cell result directory under ``root`` (download-artifact or local layout; a capacity
    cell's steps right after it, each naming its cell), and notes on what was not followed."""
    skipped: list[str] = []
    return find_cells(root, skipped), skipped


def read_point(path: Path, step_of: str = "") -> PointFacts:
    """The figures, verdict, provenance and request timeline of one result directory (``step_of``: the
    capacity cell it is a step of); InputError naming the directory when it breaks the
    result-directory contract."""
    timeline = RequestTimeline()
    row = load_cell(FoundCell(path, path.name, step_of), observe=timeline.add)
    if step_of:
        row.notes.insert(0, f"step of capacity cell {step_of}")
    result = row.result
    if row.status == "MALFORMED" or result is None:  # a row that is not MALFORMED was read
        raise InputError(f"{path}: not a readable result ({row.reason})")
    record, summary = result.record, result.summary
    if "req_records" not in row.figures:  # collect did not recount the records (a FAILED cell)
        _read_records(path, timeline)
    metrics: dict[str, float] = {}
    labels: dict[str, str] = {}
    for column in columns.METRICS:
        if column.unit in (columns.Unit.JSON, columns.Unit.LABEL):
            if text := row.text(column.name):
                labels[column.name] = text
        elif (number := row.number(column.name)) is not None:
            metrics[column.name] = number
    # A capacity cell replays nothing itself (it has no summary): its figures are its steps' (points of
    # their own) and capacity.json's (kept, and in the drill-down). Nor has a FAILED cell.
    block, noise = read_stability(summary, metrics.get("clock_scale", 1.0))
    slo_run: dict[str, Any] = {}
    if summary is not None and result.cell is not None and row.status in ("SUCCESS", "INVALID"):
        figures = run_figures(path, result.cell, distinct_constraints(DEFAULT_TIERS), summary)
        slo_run = {
            "statistics": figures.statistics,
            "output": figures.output_tok_per_s_per_gpu,
            "total": figures.total_tok_per_s_per_gpu,
            "kv_working_set": figures.kv_working_set_tokens,
            "kv_pool": figures.kv_pool_tokens,
        }
    return PointFacts(
        path=path,
        exp_name=record.exp_name or path.name,
        status=row.status,
        reason=row.reason,
        notes=list(row.notes),
        cell=dict(record.cell),
        hardware=row.text(columns.HARDWARE_LABEL.name),
        engine_version=row.text("engine_version"),
        start_utc=record.start_utc,
        end_utc=record.end_utc,
        metrics=metrics,
        labels=labels,
        validity=dict(summary.get("validity") or {}) if summary is not None else {},
        stability=block,
        noise=noise,
        throughput_noise=read_throughput_noise(timeline, summary, metrics),
        slo_run=slo_run,
        requests=timeline,
        capacity=result.capacity,
        router=result.router,
        router_error=result.router_error,
    )


def _read_records(path: Path, timeline: RequestTimeline) -> None:
    """Every record of requests.jsonl into ``timeline`` (none when the file is absent)."""
    file = path / REQUESTS_JSONL
    if not file.exists() and not file.is_symlink():
        return
    try:
        for rec in RecordReader(file, required=()):
            timeline.add(rec)
    except ResultError as err:
        raise InputError(f"{path}: {err}") from None


def read_stability(
    summary: Summary | None, clock_scale: float
) -> tuple[dict[str, Any], dict[str, tuple[float, float]]]:
    """summary.json's stability block as written, and from it, per store metric, the (min, max) of
    its sub-window values in the engine's clock like the metrics themselves.

    The one reader of the block. Its keys are InferenceX's flat ones,
    ``observed_window_{p75,p90}_{ttft,e2el,intvty}_{min,max}`` (latencies in s, interactivity in
    tok/s per user); other keys are kept in the block and not read. A metric needs both ends.
    """
    raw = cast(dict[str, Any], summary).get("stability") if summary is not None else None
    block: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
    ranges: dict[str, tuple[float, float]] = {}
    for key, (template, power) in STABILITY_METRICS.items():
        for stat in STABILITY_STATS:
            low = finite(block.get(f"observed_window_{stat}_{key}_min"))
            high = finite(block.get(f"observed_window_{stat}_{key}_max"))
            if low is None or high is None:
                continue
            scaled = [v * clock_scale if power > 0 else v / clock_scale for v in (low, high)]
            ranges[template.format(p=stat)] = (min(scaled), max(scaled))
    return block, ranges


# Throughput metrics -> which tokens they count (the noise figure scales with the value).
THROUGHPUT_NOISE_METRICS = {
    "output_tok_per_s_per_gpu": "output",
    "total_tok_per_s_per_gpu": "total",
    "input_tok_per_s_per_gpu": "input",
    "output_tok_per_s": "output",
    "total_tok_per_s": "total",
    "input_tok_per_s": "input",
}
NOISE_SPREAD = 2.0  # standard errors either side of the value


def read_throughput_noise(
    timeline: RequestTimeline, summary: Summary | None, metrics: dict[str, float]
) -> dict[str, tuple[float, float]]:
    """Per throughput metric, its value ± 2 standard errors, the standard error from the measurement
    window's sub-windows (those of the stability block: tokens of the successful profile requests
    that finished in each, over its length; the mean of k sub-windows has the standard error of their
    spread over √k). Relative, so the clock does not matter. Empty without a window in
    requests.jsonl's clock (a summary written before it) or with fewer than 3 sub-windows."""
    if summary is None:
        return {}
    window = cast(dict[str, Any], summary.get("window") or {})
    start, stop = finite(window.get("start_s")), finite(window.get("end_s"))
    if start is None or stop is None or stop <= start:
        return {}
    block = cast(dict[str, Any], summary.get("stability") or {})
    length = finite(block.get("subwindow_s")) or subwindow_length(stop - start)
    count = int((stop - start) / length + 1e-9) if length > 0 else 0
    if count < MIN_SUBWINDOWS:
        return {}
    sums = {"output": [0.0] * count, "input": [0.0] * count}
    for i in range(len(timeline)):
        done = timeline.done[i]
        if timeline.flags[i] != 1 or not start <= done <= stop:  # ok, not warmup, finished in the window
            continue
        k = min(count - 1, int((done - start) / length))
        sums["output"][k] += timeline.output_tokens[i]
        sums["input"][k] += timeline.prompt_tokens[i]
    sums["total"] = [a + b for a, b in zip(sums["output"], sums["input"], strict=True)]
    relative: dict[str, float] = {}
    for kind, values in sums.items():
        mean = math.fsum(values) / count
        if mean > 0:
            spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (count - 1))
            relative[kind] = spread / mean / math.sqrt(count)
    out = {}
    for metric, kind in THROUGHPUT_NOISE_METRICS.items():
        value = metrics.get(metric)
        if value is not None and kind in relative:
            half = NOISE_SPREAD * relative[kind] * value
            out[metric] = (value - half, value + half)
    return out


def kept_files(path: Path, names: Iterable[str]) -> list[str]:
    """Which of the directory's files (relative names, from its receipt) the store keeps whole."""
    out = []
    for name in names:
        try:
            declared = result_file(name)
        except KeyError:
            continue
        if declared in KEPT and "/" not in name and exists(path / name):  # read_parts refuses a link
            out.append(name)
    return out


def read_parts(path: Path, part_bytes: int) -> Iterator[bytes]:
    """A file's bytes in pieces of about ``part_bytes``, each ending at a line end (a record is never
    split): the store copies a kept file as it is, whatever it holds, like the receipt hashes it.

    Only a regular file is read: a link (to /proc/self/environ, say) is refused, never read through;
    InputError names it."""
    try:
        fh = open_regular(path, follow_links=False)
    except InputFileProblem as err:
        raise InputError(f"{path}: {err}; not stored") from None
    with fh:
        carry = b""
        while True:
            chunk = fh.read(part_bytes)
            if not chunk:
                break
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            carry = data[cut:]
            yield data[:cut]
        if carry:
            yield carry


# --- the drill-down payload -------------------------------------------------------------------


def _rounded(
    values: Iterable[float], scale: float, offset: float = 0.0, digits: int = 4
) -> list[float | None]:
    """``(v - offset) * scale`` rounded, non-finite values as None (a short series)."""
    out: list[float | None] = []
    for v in values:
        x = (v - offset) * scale
        out.append(round(x, digits) if math.isfinite(x) else None)
    return out


def _column(values: array[float], scale: float, digits: int) -> list[float | None]:
    """A request column (up to millions of values) ``v * scale`` rounded, non-finite values as None."""
    data = np.round(np.frombuffer(values, dtype=np.float64) * scale, digits)
    out: list[float | None] = data.tolist()
    bad = np.flatnonzero(~np.isfinite(data))
    for i in bad.tolist():
        out[i] = None
    return out


def _scrape_columns(file: Path) -> dict[str, tuple[list[float], list[float]]] | None:
    """(times, values) per engine-neutral column of one server_metrics CSV, time-sorted, empty cells
    left out; None when the file is absent, cannot be read as scrapes, or holds text where numbers
    belong (as collect judges it)."""
    if not file.exists() and not file.is_symlink():
        return None
    reader = ScrapeReader(file, FIGURES)
    try:
        rows = sorted(reader, key=lambda scrape: scrape.time_s)
    except ResultFileError:
        return None
    if any(row.not_number is not None for row in rows):
        return None
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in reader.figures}
    for row in rows:
        for name, value in row.values.items():
            if value is not None:
                ts, vs = out[name]
                ts.append(row.time_s)
                vs.append(value)
    return out


def _server_series(file: Path, t0: float, scale: float) -> dict[str, Any] | None:
    """KV usage and hit rates over time from one server_metrics CSV (times from the run start)."""
    series = _scrape_columns(file)
    if series is None:
        return None
    out: dict[str, Any] = {}
    for key, name in (
        ("kv", "kv_cache_usage"),
        ("cpu_kv", "cpu_kv_cache_usage"),
        ("running", "requests_running"),
        ("waiting", "requests_waiting"),
    ):
        ts, vs = series[name]
        out[key] = {"t": _rounded(ts, scale, t0, 3), "v": [round(v, 5) for v in vs]}
    q_t, q_v = series["prefix_cache_queries_total"]
    for key, name in (("gpu_hit", "prefix_cache_hits_total"), ("cpu_hit", "cpu_cache_hits_total")):
        hits = dict(zip(*series[name], strict=True))
        ts_out: list[float] = []
        vs_out: list[float] = []
        prev: tuple[float, float, float] | None = None
        for t, q in zip(q_t, q_v, strict=True):
            h = hits.get(t)
            if h is None:
                continue
            if prev is not None and q > prev[1] and h >= prev[2]:
                ts_out.append(t)
                vs_out.append((h - prev[2]) / (q - prev[1]))
            prev = (t, q, h)
        out[key] = {"t": _rounded(ts_out, scale, t0, 3), "v": [round(v, 5) for v in vs_out]}
    return out


def _router_series(facts: PointFacts, t0: float, scale: float, notes: list[str]) -> dict[str, Any] | None:
    """Requests the router sent each instance: over time (router_metrics.csv) and in total
    (router.json's per-instance lists, as collect read them). A router.json that breaks its contract
    leaves a note."""
    out: dict[str, Any] = {}
    file = facts.path / ROUTER_METRICS_CSV
    if file.exists() or file.is_symlink():
        reader = ScrapeReader(file, None)  # every column: requests.<instance> per instance
        try:
            rows = list(reader)
        except ResultFileError as err:
            notes.append(f"drill-down: {err}")
            rows = []
        prefix = "requests."
        names = [c for c in reader.figures if c.startswith(prefix)]
        if rows and names:
            out["over_time"] = {
                "t": _rounded((row.time_s for row in rows), scale, t0, 3),
                "instances": {c[len(prefix) :]: [row.values[c] for row in rows] for c in names},
            }
    if facts.router_error is not None:
        notes.append(f"drill-down: {facts.router_error}")
    router = facts.router
    if router is not None:
        totals = {
            key: [float(v) for v in value]
            for key in ("requests_by_replica", "requests_by_prefill", "requests_by_decode")
            if (value := getattr(router, key)) is not None
        }
        if totals:
            out["totals"] = totals
    return out or None


def _capacity(facts: PointFacts, notes: list[str]) -> dict[str, Any] | None:
    """capacity.json: a capacity cell's as collect read it; one beside any other cell is read here
    (it is no part of that cell's result), one that breaks its contract leaving a note."""
    record = facts.capacity
    if record is None:
        try:
            record = read_capacity(facts.path)
        except ResultFileError as err:
            notes.append(f"drill-down: {err}")
            return None
    return None if record is None else record.model_dump(mode="json")


def payload_json(payload: dict[str, Any]) -> bytes:
    """The drill-down payload as compact JSON (orjson where installed: it holds millions of numbers;
    every number in it is finite, see ``_column``)."""
    return dumps(payload)


def drilldown(facts: PointFacts, max_requests: int = DRILLDOWN_MAX_REQUESTS) -> dict[str, Any]:
    """What the dashboard's drill-down draws for one point, as one JSON-able value.

    Times count from the run's start, latencies are in the engine's clock (a simulated cell at
    speed S: wall seconds x S), like the point's figures. The run's start in Unix time (to place the
    server's scrapes) is the window start less the last warmup request's end, as the replayer
    defines its window.
    """
    path, scale, req = facts.path, facts.clock_scale, facts.requests
    n = len(req)
    stride = max(1, math.ceil(n / max_requests)) if n else 1
    window_start = facts.metrics.get("window_start_unix")
    window_end = facts.metrics.get("window_end_unix")
    t0 = window_start - req.warmup_end if window_start is not None else None
    notes = list(facts.notes)
    picked = {
        name: getattr(req, name)[::stride] if stride > 1 else getattr(req, name)
        for name in ("t", "done", "ttft", "itl", "lane", "flags")
    }
    payload: dict[str, Any] = {
        "v": DRILLDOWN_VERSION,
        "exp_name": facts.exp_name,
        "status": facts.status,
        "reason": facts.reason,
        "notes": notes,
        "clock_scale": scale,
        "window": (
            [round(req.warmup_end * scale, 3), round((window_end - t0) * scale, 3)]
            if t0 is not None and window_end is not None
            else None
        ),
        "requests": {
            "total": n,
            "stride": stride,
            "t": _column(picked["t"], scale, 4),
            "done": _column(picked["done"], scale, 4),
            "ttft": _column(picked["ttft"], scale, 5),
            "itl": _column(picked["itl"], scale, 6),
            "lane": picked["lane"].tolist(),
            "flags": picked["flags"].tolist(),
        },
        "server": _server_series(path / SERVER_METRICS_CSV, t0, scale) if t0 is not None else None,
        "router": _router_series(facts, t0, scale, notes) if t0 is not None else None,
        "checks": [
            {
                "name": name,
                "value": check.get("value"),
                "limit": check.get("limit"),
                "ok": check.get("ok"),
                "reason": check.get("reason", ""),
            }
            for name, check in (facts.validity.get("checks") or {}).items()
            if isinstance(check, dict)
        ],
        "capacity": _capacity(facts, notes),
    }
    return payload
