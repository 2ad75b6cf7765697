"""Every read of a cell result directory that the store and the dashboard make, in one module.

ARCHITECTURE §3 gives the result directory one owner in the contract layer. Until its typed readers
are there, this module reads through the readers that exist: collect's (``find_cells``,
``read_cell_json``, ``load_cell`` for the figures of summary.csv, ``read_series`` for
server_metrics.csv) and the replayer's (``read_summary``). Nothing else in ``agentsweep.store`` or
``agentsweep.dashboard`` opens a result file by name, so moving to the owner changes this module only.

Everything the dashboard draws is taken from the files here, at ingest, into one drill-down payload
per point (``drilldown``); the store also keeps the files themselves (``KEPT_FILES``), compressed.
"""

from __future__ import annotations

import csv
import json
import math
import re
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kv_cache_tester.replay import ResultError, read_summary

from agentsweep.collect import columns
from agentsweep.collect.aggregate import load_cell
from agentsweep.collect.discover import FoundCell, find_cells
from agentsweep.collect.window import NotNumbers, read_series
from agentsweep.contract.cell import RoleShape, shape_label
from agentsweep.contract.resultdir import read_cell_record
from agentsweep.errors import InputError, ResultFileError

try:  # orjson is an optional speed-up (kv-cache-tester[fast]); json is the fallback
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - exercised only without the extra
    _loads = json.loads

# Files kept whole (compressed) in the store beside the figures: the records, the scrapes, the
# router's counts, capacity results. Matched on the name relative to the result directory.
KEPT_FILES = re.compile(
    r"^(requests\.jsonl|server_metrics(\.[A-Za-z0-9_-]+)?\.csv|router_metrics\.csv|router\.json"
    r"|capacity\.json|summary\.json|cell\.json)$"
)
REQUESTS_FILE = "requests.jsonl"
SERVER_METRICS_FILE = "server_metrics.csv"
ROUTER_METRICS_FILE = "router_metrics.csv"
ROUTER_FILE = "router.json"
CAPACITY_FILE = "capacity.json"
SUMMARY_FILE = "summary.json"
MAX_SMALL_JSON_BYTES = 64 << 20
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
STABILITY_KEY = re.compile(r"^observed_window_(p\d+)_(ttft|e2el|intvty)_(min|max)$")


@dataclass
class PointFacts:
    """What the store keeps of one result directory (besides its files)."""

    path: Path
    exp_name: str
    status: str  # SUCCESS | INVALID | FAILED
    reason: str
    notes: list[str]
    cell: dict[str, Any]  # cell.json's cell, as written
    engine_version: str
    start_utc: str | None
    end_utc: str | None
    metrics: dict[str, float]  # collect's numeric columns (engine clock), finite values only
    labels: dict[str, str]  # collect's text columns (router policy, disaggregation shape, ...)
    validity: dict[str, Any]  # summary.json's validity (every check with value and limit); {} if none
    stability: dict[str, Any]  # summary.json's stability block; {} if none
    noise: dict[str, tuple[float, float]] = field(default_factory=dict)  # metric -> (min, max)

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


def find_result_dirs(root: Path) -> tuple[list[Path], list[str]]:
    """Every cell result directory under ``root`` (download-artifact or local layout), and notes on
    what was not followed."""
    skipped: list[str] = []
    found = find_cells(root, skipped)
    return [cell.path for cell in found], skipped


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _read_json(path: Path) -> Any:
    if not path.is_file() or path.stat().st_size > MAX_SMALL_JSON_BYTES:
        return None
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def read_point(path: Path) -> PointFacts:
    """The figures, verdict and provenance of one result directory; InputError naming the directory
    when it breaks the result-directory contract."""
    try:
        record = read_cell_record(path)
    except ResultFileError as err:
        raise InputError(f"{path}: not a readable result ({err})") from None
    if record is None:
        raise InputError(f"{path}: not a readable result (cell.json missing)")
    row = load_cell(FoundCell(path, record.exp_name or path.name))
    if row.status == "MALFORMED":
        raise InputError(f"{path}: not a readable result ({row.reason})")
    metrics: dict[str, float] = {}
    labels: dict[str, str] = {}
    for column in columns.METRICS:
        value = row.values.get(column.name)
        if column.unit in (columns.Unit.JSON, columns.Unit.LABEL):
            if value not in (None, ""):
                labels[column.name] = str(value)
        else:
            number = _number(value)
            if number is not None:
                metrics[column.name] = number
    validity: dict[str, Any] = {}
    stability: dict[str, Any] = {}
    summary = _read_json(path / SUMMARY_FILE) if row.status != "FAILED" else None
    if summary is not None:
        try:
            checked = read_summary(summary, SUMMARY_FILE)
        except ResultError as err:
            raise InputError(f"{path}: {err}") from None
        validity = dict(checked.get("validity") or {})
        block = summary.get("stability")
        stability = dict(block) if isinstance(block, dict) else {}
    facts = PointFacts(
        path=path,
        exp_name=row.exp_name,
        status=row.status,
        reason=row.reason,
        notes=list(row.notes),
        cell=dict(record.cell),
        engine_version=str(row.values.get("engine_version") or ""),
        start_utc=record.start_utc,
        end_utc=record.end_utc,
        metrics=metrics,
        labels=labels,
        validity=validity,
        stability=stability,
    )
    facts.noise = noise_ranges(stability, facts.clock_scale)
    return facts


def noise_ranges(stability: dict[str, Any], clock_scale: float) -> dict[str, tuple[float, float]]:
    """Per metric, the (min, max) of its sub-window values from a stability block, in the engine's
    clock like the metrics themselves. Keys follow InferenceX (``observed_window_p90_ttft_min``)."""
    bounds: dict[str, dict[str, float]] = {}
    for key, value in stability.items():
        m = STABILITY_KEY.match(str(key))
        number = _number(value)
        if not m or number is None:
            continue
        stat, metric, end = m.groups()
        template, power = STABILITY_METRICS[metric]
        scaled = number * clock_scale if power > 0 else number / clock_scale
        bounds.setdefault(template.format(p=stat), {})[end] = scaled
    return {
        name: (min(b["min"], b["max"]), max(b["min"], b["max"]))
        for name, b in bounds.items()
        if "min" in b and "max" in b
    }


def kept_files(path: Path, names: list[str]) -> list[str]:
    """Which of the directory's files (relative names, from its receipt) the store keeps whole."""
    return [name for name in names if KEPT_FILES.match(name) and (path / name).is_file()]


def read_parts(path: Path, part_bytes: int) -> Iterator[bytes]:
    """A file in pieces of about ``part_bytes``, each ending at a line end (a record is never split)."""
    with path.open("rb") as fh:
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


@dataclass
class _Requests:
    t: array[float] = field(default_factory=lambda: array("d"))
    done: array[float] = field(default_factory=lambda: array("d"))
    ttft: array[float] = field(default_factory=lambda: array("d"))
    itl: array[float] = field(default_factory=lambda: array("d"))
    lane: array[int] = field(default_factory=lambda: array("l"))
    flags: array[int] = field(default_factory=lambda: array("b"))  # 1 ok, 2 warmup (bits)
    warmup_end: float = 0.0


def _fast(value: Any) -> float:
    """A finite number as float, anything else NaN (a record's value of the wrong type is absent).
    Type checks by identity: this runs several times per record of million-record files."""
    kind = type(value)
    if kind is float:
        return value if value - value == 0.0 else math.nan  # inf - inf and nan - nan are nan
    if kind is int:
        return float(value)
    return math.nan


def _read_requests(path: Path) -> _Requests:
    out = _Requests()
    file = path / REQUESTS_FILE
    if not file.is_file():
        return out
    t_, done_, ttft_, itl_, lane_, flags_ = out.t, out.done, out.ttft, out.itl, out.lane, out.flags
    warmup_end = 0.0
    with file.open("rb") as fh:
        for raw in fh:
            try:
                rec = _loads(raw)
            except ValueError:
                continue
            if type(rec) is not dict:
                continue
            t = _fast(rec.get("t_dispatch"))
            if t != t:
                continue
            done = _fast(rec.get("t_done"))
            warm = rec.get("phase") == "warmup"
            if warm and done == done and done > warmup_end:
                warmup_end = done
            itl = rec.get("itl_s")
            if type(itl) is dict:  # the mean, or the median where a writer kept only that
                mean = itl.get("mean")
                itl = mean if mean is not None else itl.get("p50")
            user = rec.get("user")
            t_.append(t)
            done_.append(done)
            ttft_.append(_fast(rec.get("ttft_s")))
            itl_.append(_fast(itl))
            lane_.append(user if type(user) is int else -1)
            flags_.append((1 if rec.get("status") == "ok" else 0) | (2 if warm else 0))
    out.warmup_end = warmup_end
    return out


def _rounded(values: Any, scale: float, offset: float = 0.0, digits: int = 4) -> list[float | None]:
    return [None if math.isnan(v) else round((v - offset) * scale, digits) for v in values]


def _server_series(file: Path, t0: float, scale: float) -> dict[str, Any] | None:
    """KV usage and hit rates over time from one server_metrics CSV (times from the run start)."""
    if not file.is_file():
        return None
    try:
        series, _, _ = read_series(file)
    except (NotNumbers, OSError, UnicodeDecodeError):
        return None
    out: dict[str, Any] = {}
    for key, name in (
        ("kv", "kv_cache_usage"),
        ("cpu_kv", "cpu_kv_cache_usage"),
        ("running", "requests_running"),
        ("waiting", "requests_waiting"),
    ):
        s = series[name]
        out[key] = {"t": _rounded(s.t, scale, t0, 3), "v": [round(v, 5) for v in s.v]}
    queries = series["prefix_cache_queries_total"]
    for key, name in (("gpu_hit", "prefix_cache_hits_total"), ("cpu_hit", "cpu_cache_hits_total")):
        hits = dict(zip(series[name].t, series[name].v, strict=True))
        ts: list[float] = []
        vs: list[float] = []
        prev: tuple[float, float, float] | None = None
        for t, q in zip(queries.t, queries.v, strict=True):
            h = hits.get(t)
            if h is None:
                continue
            if prev is not None and q > prev[1] and h >= prev[2]:
                ts.append(t)
                vs.append((h - prev[2]) / (q - prev[1]))
            prev = (t, q, h)
        out[key] = {"t": _rounded(ts, scale, t0, 3), "v": [round(v, 5) for v in vs]}
    return out


def _router_series(path: Path, t0: float, scale: float) -> dict[str, Any] | None:
    """Requests the router sent each instance: over time (router_metrics.csv) and in total
    (router.json's per-instance lists)."""
    out: dict[str, Any] = {}
    file = path / ROUTER_METRICS_FILE
    if file.is_file():
        with file.open(newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.DictReader(fh)
            names = [c for c in reader.fieldnames or [] if c.startswith("requests.")]
            t: list[float] = []
            counts: dict[str, list[float | None]] = {c[len("requests.") :]: [] for c in names}
            for row in reader:
                when = _number(_float(row.get("time_s")))
                if when is None:
                    continue
                t.append(when)
                for c in names:
                    counts[c[len("requests.") :]].append(_number(_float(row.get(c))))
        if t and counts:
            out["over_time"] = {"t": _rounded(t, scale, t0, 3), "instances": counts}
    doc = _read_json(path / ROUTER_FILE)
    if isinstance(doc, dict):
        totals = {
            key: [_number(v) for v in doc[key]]
            for key in ("requests_by_replica", "requests_by_prefill", "requests_by_decode")
            if isinstance(doc.get(key), list)
        }
        if totals:
            out["totals"] = totals
    return out or None


def _float(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def drilldown(facts: PointFacts, max_requests: int = DRILLDOWN_MAX_REQUESTS) -> dict[str, Any]:
    """What the dashboard's drill-down draws for one point, as one JSON-able value.

    Times count from the run's start, latencies are in the engine's clock (a simulated cell at
    speed S: wall seconds x S), like the point's figures. The run's start in Unix time (to place the
    server's scrapes) is the window start less the last warmup request's end, as the replayer
    defines its window.
    """
    path, scale = facts.path, facts.clock_scale
    req = _read_requests(path)
    n = len(req.t)
    stride = max(1, math.ceil(n / max_requests)) if n else 1
    pick = slice(None, None, stride)
    window_start = facts.metrics.get("window_start_unix")
    window_end = facts.metrics.get("window_end_unix")
    t0 = window_start - req.warmup_end if window_start is not None else None
    payload: dict[str, Any] = {
        "v": DRILLDOWN_VERSION,
        "exp_name": facts.exp_name,
        "status": facts.status,
        "reason": facts.reason,
        "notes": facts.notes,
        "clock_scale": scale,
        "window": (
            [round(req.warmup_end * scale, 3), round((window_end - t0) * scale, 3)]
            if t0 is not None and window_end is not None
            else None
        ),
        "requests": {
            "total": n,
            "stride": stride,
            "t": _rounded(req.t[pick], scale),
            "done": _rounded(req.done[pick], scale),
            "ttft": _rounded(req.ttft[pick], scale, digits=5),
            "itl": _rounded(req.itl[pick], scale, digits=6),
            "lane": list(req.lane[pick]),
            "flags": list(req.flags[pick]),
        },
        "server": _server_series(path / SERVER_METRICS_FILE, t0, scale) if t0 is not None else None,
        "router": _router_series(path, t0, scale) if t0 is not None else None,
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
        "capacity": _read_json(path / CAPACITY_FILE),
    }
    return payload
