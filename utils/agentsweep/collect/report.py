"""report.html (self-contained: CSS inline, images as base64) and summary.md for the job summary."""

from __future__ import annotations

import base64
import html
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape
from kv_cache_tester.metrics import finite

from agentsweep import __version__
from agentsweep.collect.aggregate import natural_key
from agentsweep.collect.capacity import CapacityResults
from agentsweep.collect.capacity_plots import capacity_plot_name
from agentsweep.collect.headline import (
    INTERACTIVITY_TEXT,
    Headline,
    agents_text,
    capacity_binding,
    capacity_reading,
    configuration,
    headline,
)
from agentsweep.collect.output import write_text
from agentsweep.collect.pareto import routed
from agentsweep.collect.table import TableRow
from agentsweep.collect.window import INFERRED, READ_FROM_ENGINE

TEMPLATES = Path(__file__).parent / "templates"
# Identity of the sweep, read from the cells' own cell.json fields.
IDENTITY_FIELDS = (
    ("config_key", "Config key"),
    ("model", "Model"),
    ("engine", "Engine"),
    ("engine_version", "Engine version"),
    ("replayer_version", "Replayer version (from the receipts)"),
    ("hardware_label", "Hardware"),  # "simulated B300" when the simulated engine stood in for it
    ("runner", "Runner"),
    ("precision", "Precision"),
    ("duration", "Replay duration (s)"),
    ("traces", "Traces"),
    ("client", "Client"),
    ("clock_scale", "Engine clock speed-up (figures are in engine time)"),
)
REPLAY_OPTIONS = (
    "preset",
    "timing_strategy",
    "max_delay",
    "advance_min",
    "advance_max",
    "max_context",
    "warmup_requests",
    "api",
    "ignore_eos",
    "seed",
    "speed",
)
# (column, header, format) of the summary table.
TABLE = (
    ("exp_name", "Cell", "text"),
    ("status", "Status", "text"),
    ("tp", "TP", "int"),
    ("users", "Users", "int"),
    ("offload", "Offload", "text"),
    ("output_tok_per_s_per_gpu", "Out tok/s/GPU", "num"),
    ("total_tok_per_s_per_gpu", "Total tok/s/GPU", "num"),
    ("ttft_p50_s", "TTFT p50 (s)", "sec"),
    ("ttft_p99_s", "TTFT p99 (s)", "sec"),
    ("e2e_p50_s", "E2E p50 (s)", "sec"),
    # Interactivity is 1 / full-response ITL at the percentile (docs/metrics.md), as InferenceX's rows.
    ("interactivity_p50_tok_per_s", "Interact. p50 (tok/s, 1/full-resp. ITL)", "num"),
    ("interactivity_p90_tok_per_s", "Interact. p90 (tok/s, 1/full-resp. ITL)", "num"),
    # InferenceX's headline x-axis: 1 / p90 of E2E per output token (docs/metrics.md).
    ("e2e_norm_interactivity_p90_tok_per_s", "E2E-norm. interact. p90 (tok/s)", "num"),
    ("gpu_hit_rate", "GPU hit", "pct"),
    ("cpu_hit_rate", "CPU hit", "pct"),
    ("theoretical_hit_rate", "Ideal hit", "pct"),
    ("kv_usage_peak", "KV peak", "pct"),
    ("past_kv_cliff", "Past KV cliff", "cliff"),
    ("preemptions", "Preempt.", "int"),
    ("requests_failed", "Req. failed", "int"),
)
# Shown after Offload when some cell runs behind a router (docs/scaleout.md).
ROUTED_TABLE = (
    ("replicas", "Replicas", "int"),
    ("router", "Router", "text"),
    ("disagg", "Disagg.", "text"),
    ("nodes", "Nodes", "int"),
    ("router_busiest_share", "Busiest inst.", "pct"),
    ("router_affinity_share", "Affinity", "pct"),
    ("router_prefix_match", "Router prefix match", "pct"),
    ("replica_gpu_hit_min", "Inst. GPU hit min", "pct"),
    ("replica_gpu_hit_max", "Inst. GPU hit max", "pct"),
    ("prefill_gpu_hit_rate", "Prefill GPU hit", "pct"),
)
# Shown only when some cell has a value: a sweep of one node and no disaggregation needs none of them.
SPARSE = ("disagg", "nodes", "prefill_gpu_hit_rate")
# Shown after E2E when some cell reports in the engine's clock (a simulated cell; docs/collect.md).
CLOCK_TABLE = (("client_gap_ttft_p50", "Client TTFT gap", "pct"),)
# Shown after Offload when some cell's engine was scored by the accuracy gate (docs/accuracy.md).
ACCURACY_TABLE = (
    ("accuracy_score", "Accuracy", "score"),
    ("accuracy_outcome", "Accuracy gate", "text"),
)
# Shown at the end when some cell has valid power figures (docs/energy.md).
POWER_TABLE = (
    ("joules_per_output_token", "J/out tok", "num3"),
    ("avg_power_per_gpu_w", "W/GPU", "num"),
    ("power_reasons", "Power withheld because", "reasons"),
)


# The summary table's column sets in report.html: the identity columns stay put (sticky) while the
# others scroll, and each other set can be hidden. (key, heading); a column's set is COLUMN_SET's.
COLUMN_SETS = (
    ("identity", ""),
    ("routing", "Routing"),
    ("accuracy", "Accuracy"),
    ("throughput", "Throughput per GPU (tok/s)"),
    ("latency", "Latency (s)"),
    ("interactivity", "Interactivity (tok/s per user)"),
    ("cache", "KV cache"),
    ("health", "Health"),
    ("power", "Power"),
)
HIDDEN_SETS = ("health",)  # hidden until asked for
COLUMN_SET = {
    **dict.fromkeys(("exp_name", "status", "tp", "users", "offload"), "identity"),
    **{c: "routing" for c, _h, _k in ROUTED_TABLE},
    **dict.fromkeys(("output_tok_per_s_per_gpu", "total_tok_per_s_per_gpu"), "throughput"),
    **dict.fromkeys(("ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "client_gap_ttft_p50"), "latency"),
    **dict.fromkeys(
        (
            "interactivity_p50_tok_per_s",
            "interactivity_p90_tok_per_s",
            "e2e_norm_interactivity_p90_tok_per_s",
        ),
        "interactivity",
    ),
    **dict.fromkeys(
        ("gpu_hit_rate", "cpu_hit_rate", "theoretical_hit_rate", "kv_usage_peak", "past_kv_cliff"), "cache"
    ),
    **dict.fromkeys(("preemptions", "requests_failed"), "health"),
    **{c: "accuracy" for c, _h, _k in ACCURACY_TABLE},
    **{c: "power" for c, _h, _k in POWER_TABLE},
}
# Headers under a set's heading in report.html (summary.md keeps TABLE's, which say it all).
SHORT_HEADERS = {
    "output_tok_per_s_per_gpu": "Output",
    "total_tok_per_s_per_gpu": "Total",
    "ttft_p50_s": "TTFT p50",
    "ttft_p99_s": "TTFT p99",
    "e2e_p50_s": "E2E p50",
    "interactivity_p50_tok_per_s": "p50",
    "interactivity_p90_tok_per_s": "p90",
    "e2e_norm_interactivity_p90_tok_per_s": "E2E-norm. p90",
}


def _is_set(value: Any) -> bool:
    """A text field with a value (an empty CSV field reads back as NaN)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and str(value) != ""


def _has(df: pd.DataFrame, column: str) -> bool:
    if column not in df.columns:
        return False
    values = [
        v for v in df[column].tolist() if v is not None and not (isinstance(v, float) and math.isnan(v))
    ]
    if column == "nodes":
        return any(v != 1 for v in values)
    return any(v != "" for v in values)


def _scored(df: pd.DataFrame) -> bool:
    """True when the accuracy gate ran for some cell (scored it, or could not)."""
    if "accuracy_outcome" not in df.columns:
        return False
    return any(v in ("passed", "failed", "error") for v in df["accuracy_outcome"].tolist())


def _withheld(df: pd.DataFrame) -> bool:
    """True when some cell's power figures are withheld (its power_reasons list is not empty)."""
    if "power_reasons" not in df.columns:
        return False
    return any(isinstance(v, str) and v not in ("", "[]") for v in df["power_reasons"].tolist())


def table_spec(df: pd.DataFrame) -> tuple[tuple[str, str, str], ...]:
    """The summary table's (column, header, format): TABLE, with the routed columns when some cell
    runs behind a router."""
    power: tuple[tuple[str, str, str], ...] = POWER_TABLE[:2] if _has(df, "joules_per_output_token") else ()
    if power and _withheld(df):
        power += POWER_TABLE[2:]
    table: tuple[tuple[str, str, str], ...] = TABLE
    if _has(df, "client_gap_ttft_p50"):
        at = next(i for i, c in enumerate(table) if c[0] == "e2e_p50_s") + 1
        table = table[:at] + CLOCK_TABLE + table[at:]
    extra: tuple[tuple[str, str, str], ...] = ()
    if routed(df):
        extra = tuple(c for c in ROUTED_TABLE if c[0] not in SPARSE or _has(df, c[0]))
    if _scored(df):
        extra += ACCURACY_TABLE
    at = next(i for i, c in enumerate(table) if c[0] == "offload") + 1
    return table[:at] + extra + table[at:] + power


def fmt(value: Any, kind: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if kind == "text":
        return str(value) if value != "" else "–"
    if kind == "reasons":  # a JSON list of one-line reasons
        try:
            reasons = json.loads(value) if isinstance(value, str) else []
        except ValueError:
            return str(value)
        return "; ".join(str(r) for r in reasons) if isinstance(reasons, list) and reasons else "–"
    if kind == "cliff":  # a flag: 1/0 once the table is numeric
        return "yes" if value in (True, 1, "True") else "no" if value in (False, 0, "False") else "–"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if kind == "int":
        return f"{number:,.0f}"
    if kind == "pct":
        return f"{number:.1%}"
    if kind == "sec":
        return f"{number:.3f}" if number < 10 else f"{number:.1f}"
    if kind == "score":  # a share of questions answered right
        return f"{number:.2f}"
    if kind == "num3":  # small quantities such as joules per token
        return f"{number:.3g}"
    return f"{number:,.1f}" if abs(number) < 1e5 else f"{number:,.0f}"


def _distinct(df: pd.DataFrame, column: str) -> str:
    if column not in df.columns:
        return "–"
    values = []
    for value in df[column].dropna().tolist():
        text = fmt(value, "text")
        if text not in values:
            values.append(text)
    return ", ".join(values) if values else "–"


def identity(df: pd.DataFrame) -> list[tuple[str, str]]:
    rows = [(label, _distinct(df, column)) for column, label in IDENTITY_FIELDS]
    options = [
        f"{o}={_distinct(df, o)}" for o in REPLAY_OPTIONS if o in df.columns and _distinct(df, o) != "–"
    ]
    rows.append(("Replay options", "; ".join(options) if options else "–"))
    for column, label in (("tp", "TP"), ("users", "Users"), ("offload", "Offload modes")):
        if column in df.columns:
            distinct = set(df[column].dropna().tolist())
            values = sorted(
                distinct, key=lambda v: (isinstance(v, str), v if not isinstance(v, str) else 0, str(v))
            )
            kind = "text" if column == "offload" else "int"
            rows.append((label, ", ".join(fmt(v, kind) for v in values)))
    steps = df["step_of"].map(_is_set).astype(bool) if "step_of" in df.columns else None
    cells = df[~steps] if steps is not None else df
    counts = cells["status"].value_counts().to_dict() if "status" in cells.columns else {}
    rows.append(("Cells", ", ".join(f"{n} {s}" for s, n in counts.items()) or "none"))
    if steps is not None and steps.any():
        counts = df[steps]["status"].value_counts().to_dict()
        rows.append(("Capacity steps", ", ".join(f"{n} {s}" for s, n in counts.items())))
    return rows


def _search_range(row: TableRow) -> str:
    """A capacity cell's searched users (``1–16``), from its cell's ``capacity`` field."""
    try:
        spec = json.loads(str(row.get("capacity")))
        return f"{int(spec['low'])}–{int(spec['high'])}"
    except (ValueError, TypeError, KeyError):
        return "?"


def ordered_records(df: pd.DataFrame) -> list[TableRow]:
    """The table's rows in report order: as collected, a capacity cell's steps after it in user order
    (the order they ran in is the search's, not the reader's), each step with ``_run`` (its run at
    that count, from 1) and ``_runs`` (how many runs the count had)."""
    records = df.to_dict("records")
    parents = {str(r.get("exp_name")) for r in records if not _is_set(r.get("step_of"))}
    steps: dict[str, list[TableRow]] = {}
    out: list[TableRow] = []
    for row in records:
        parent = row.get("step_of")
        if _is_set(parent) and str(parent) in parents:
            steps.setdefault(str(parent), []).append(row)
    for row in records:
        if _is_set(row.get("step_of")) and str(row.get("step_of")) in parents:
            continue  # placed after its capacity cell
        out.append(row)
        mine = steps.pop(str(row.get("exp_name")), [])
        if mine:
            mine.sort(key=lambda r: (_users(r), natural_key(str(r.get("exp_name")))))
            runs: dict[float, int] = {}
            for step in mine:
                runs[_users(step)] = runs.get(_users(step), 0) + 1
            seen: dict[float, int] = {}
            for step in mine:
                seen[_users(step)] = seen.get(_users(step), 0) + 1
                out.append({**step, "_run": seen[_users(step)], "_runs": runs[_users(step)]})
    return out


def _users(row: TableRow) -> float:
    try:
        return float(row.get("users"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.inf


def row_cells(row: TableRow, spec: tuple[tuple[str, str, str], ...]) -> list[str]:
    """One row's cells as text: a capacity cell's users are its searched range, a step's users say
    which run of how many at that count it was."""
    cells = [fmt(row.get(col), kind) for col, _h, kind in spec]
    at = next((i for i, c in enumerate(spec) if c[0] == "users"), None)
    if at is not None and _is_set(row.get("capacity")):
        cells[at] = f"{_search_range(row)} (search)"
    elif at is not None and _num(row.get("_runs")) > 1:
        cells[at] += f" (run {row['_run']}/{row['_runs']})"
    return cells


def table_rows(df: pd.DataFrame) -> list[list[str]]:
    spec = table_spec(df)
    return [row_cells(row, spec) for row in ordered_records(df)]


@dataclass(frozen=True)
class Td:
    """One cell of report.html's summary table."""

    text: str
    classes: str
    colspan: int = 1
    title: str = ""


@dataclass(frozen=True)
class ReportRow:
    """A summary table row of report.html: its cells, its status, and what kind of row it is."""

    tds: list[Td]
    status: str
    kind: str  # cell | capacity | step


def _column_classes(df: pd.DataFrame) -> list[str]:
    """Per column of the table, its classes: its set, and for the identity columns their place."""
    out, identity = [], 0
    for column, _h, _k in table_spec(df):
        key = COLUMN_SET.get(column, "other")
        out.append(f"c-{key}" + (f" id-{identity}" if key == "identity" else ""))
        identity += key == "identity"
    return out


def report_rows(df: pd.DataFrame) -> list[ReportRow]:
    """The rows of report.html's summary table. A capacity cell's row has no figures of its own: one
    cell across its figure columns says where they are."""
    spec = table_spec(df)
    classes = _column_classes(df)
    identity = sum(c.startswith("c-identity") for c in classes)
    out = []
    for row in ordered_records(df):
        cells = row_cells(row, spec)
        name = str(row.get("exp_name"))
        tds = [
            Td(text, cls, title=name if i == 0 else "")
            for i, (text, cls) in enumerate(zip(cells, classes, strict=True))
        ]
        kind = "cell"
        if _is_set(row.get("capacity")):
            kind = "capacity"
            note = (
                f"capacity search over {_search_range(row)} users: its steps follow, in user order; its "
                "capacity per tier is under Capacity under SLO"
            )
            tds = [*tds[:identity], Td(note, "note", colspan=len(cells) - identity)]
        elif _is_set(row.get("step_of")):
            kind = "step"
        out.append(ReportRow(tds, str(row.get("status")), kind))
    return out


@dataclass(frozen=True)
class CapacityPanel:
    """A capacity cell's steps in the report, and its plot (None when none was drawn)."""

    steps: CapacitySteps
    plot: dict[str, str] | None


@dataclass(frozen=True)
class ColumnSet:
    """A set of the table's columns, as the report's checkboxes show and hide them."""

    key: str
    heading: str
    headers: list[str]
    hidden: bool


def column_sets(df: pd.DataFrame) -> list[ColumnSet]:
    """The table's columns grouped into their sets, in table order."""
    out: list[ColumnSet] = []
    for column, header, _kind in table_spec(df):
        key = COLUMN_SET.get(column, "other")
        if not out or out[-1].key != key:
            out.append(ColumnSet(key, dict(COLUMN_SETS).get(key, ""), [], key in HIDDEN_SETS))
        out[-1].headers.append(SHORT_HEADERS.get(column, header))
    return out


def problem_cells(df: pd.DataFrame) -> list[dict[str, str]]:
    if "status" not in df.columns:
        return []
    bad = df[df["status"] != "SUCCESS"]
    if "step_of" in bad.columns:  # a capacity cell's steps are its measurements (the capacity section)
        bad = bad[bad["step_of"].isna() | (bad["step_of"].astype(str) == "")]
    return [
        {"exp_name": str(r["exp_name"]), "status": str(r["status"]), "reason": str(r.get("reason") or "")}
        for r in bad.to_dict("records")
    ]


def hit_rows(df: pd.DataFrame) -> list[list[str]]:
    out = []
    ok = df[df["status"] == "SUCCESS"] if "status" in df.columns else df.iloc[0:0]
    for r in ok.to_dict("records"):
        gpu, cpu, ideal = r.get("gpu_hit_rate"), r.get("cpu_hit_rate"), r.get("theoretical_hit_rate")
        measured = None
        if gpu is not None and math.isfinite(gpu):
            measured = gpu + (cpu if cpu is not None and math.isfinite(cpu) else 0.0)
        share = measured / ideal if measured is not None and ideal and math.isfinite(ideal) else None
        out.append(
            [
                str(r["exp_name"]),
                fmt(ideal, "pct"),
                fmt(gpu, "pct"),
                fmt(cpu, "pct"),
                fmt(measured, "pct"),
                fmt(share, "pct"),
                fmt(r.get("client_hit_rate"), "pct"),
                fmt(r.get("cpu_tier_hit_rate"), "pct"),
                CPU_TIER_SOURCES.get(str(r.get("cpu_tier_hit_source") or ""), "-"),
            ]
        )
    return out


# How the cache panel names where the CPU tier's lookups came from (window.cpu_tier_figures).
CPU_TIER_SOURCES = {
    READ_FROM_ENGINE: "engine counter",
    INFERRED: "inferred (GPU misses)",
}


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


# (column, header, format) of the capacity table in the report.
CAPACITY_TABLE = (
    ("source", "Source", "text"),
    ("cell", "Cell / series", "text"),
    ("tier", "Tier", "text"),
    ("agents_per_gpu", "Agents/GPU", "num"),
    ("boundary_users", "Users", "num"),
    ("interval_low", "Interval low", "int"),
    ("interval_high", "Interval high", "int"),
    ("boundary_type", "Boundary", "text"),
    ("binding", "Bound by", "text"),
    ("output_tok_per_s_per_gpu", "Out tok/s/GPU", "num"),
    ("total_tok_per_s_per_gpu", "Total tok/s/GPU", "num"),
    ("agents_per_mw", "Agents/MW", "num"),
    ("stop_reason", "Stop reason", "text"),
)


@dataclass(frozen=True)
class CapacityTier:
    """One tier's capacity per configuration, best first; configurations that meet it nowhere apart."""

    description: str
    rows: list[list[str]]  # CAPACITY_TIER_HEADERS
    unmet: list[str]  # "TP 1 · offload noprefix (grid): even 2 users miss it, bound by TTFT p90 (12 s)"


CAPACITY_TIER_HEADERS = (
    "Configuration",
    "Agents/GPU",
    "Agents/MW",
    "Out tok/s/GPU at it",
    "Bound by",
    "How it was read",
)


def _num(value: Any) -> float:
    """A figure of the capacity table, 0 where it has none (for ordering)."""
    number = finite(value)
    return 0.0 if number is None else number


def capacity_tiers(capacity: CapacityResults | None) -> list[CapacityTier]:
    """The capacity table per tier: configurations that meet it by agents per GPU (most first), then
    in one list the ones that meet it nowhere, so that zeros do not bury the answer."""
    if capacity is None or capacity.table.empty:
        return []
    records = capacity.table.to_dict("records")
    engines = len({str(r.get("engine")) for r in records}) > 1
    tiers: dict[str, list[TableRow]] = {}
    for r in records:
        tiers.setdefault(str(r.get("tier")), []).append(r)
    out = []
    for rows in tiers.values():
        met = [r for r in rows if r.get("boundary_type") != "none" and _num(r.get("boundary_users")) > 0]
        # The headline's order: most agents per GPU, then most output tok/s per GPU at the boundary.
        met.sort(key=lambda r: (-_num(r.get("agents_per_gpu")), -_num(r.get("output_tok_per_s_per_gpu"))))
        unmet = []
        for r in rows:
            if r in met:
                continue
            label = configuration({**r, "users": None}, engines).text(with_users=False)
            where = "search" if r.get("source") == "search" else "grid"
            unmet.append(f"{label} ({where}) misses it: {capacity_binding(r)}")
        table = []
        for r in met:
            at_least = r.get("boundary_type") in ("at_least", "unresolved")
            table.append(
                [
                    configuration({**r, "users": None}, engines).text(with_users=False),
                    ("≥ " if at_least else "") + agents_text(_num(r.get("agents_per_gpu"))),
                    fmt(r.get("agents_per_mw"), "int"),
                    fmt(r.get("output_tok_per_s_per_gpu"), "num"),
                    capacity_binding(r),
                    capacity_reading(r),
                ]
            )
        out.append(CapacityTier(str(rows[0].get("description") or rows[0].get("tier")), table, unmet))
    return out


@dataclass(frozen=True)
class CapacitySteps:
    """A capacity cell's steps by user count (the reader's order), each count with its runs."""

    exp_name: str
    headers: list[str]
    rows: list[list[str]]
    runs_note: str


def capacity_steps(capacity: CapacityResults | None) -> list[CapacitySteps]:
    if capacity is None:
        return []
    out = []
    for item in capacity.cells:
        spec = item.cell.capacity
        if spec is None or not item.record.steps:
            continue
        constraints = spec.constraints
        by_users: dict[int, list[Any]] = {}
        for step in item.record.steps:
            by_users.setdefault(step.users, []).append(step)
        rows = []
        for users in sorted(by_users):
            runs = by_users[users]
            verdicts = ", ".join(f"{n} {v}" for v, n in Counter(s.status for s in runs).items())
            figures = []
            for constraint in constraints:
                values = [s.statistics.get(constraint.key) for s in runs]
                figures.append(
                    " / ".join(constraint.format_value(v) if v is not None else "–" for v in values)
                )
            outputs = [s.output_tok_per_s_per_gpu for s in runs]
            rows.append(
                [
                    str(users),
                    str(len(runs)),
                    verdicts,
                    *figures,
                    " / ".join(fmt(v, "num") for v in outputs),
                    ", ".join(str(s.index) for s in runs),
                ]
            )
        headers = [
            "Users",
            "Runs",
            "Verdicts",
            *(c.statistic_label for c in constraints),
            "Out tok/s/GPU",
            "Search order (step)",
        ]
        repeats = item.record.repeats
        note = (
            "one run per count: the bracket around a boundary is the search's resolution, not a measured "
            "spread (a config's users: {search: ..., repeats: N} measures that)"
            if repeats == 1
            else f"{repeats} runs per count (values of each run, in order); the tiers' intervals are bootstrapped"
        )
        out.append(CapacitySteps(item.exp_name, headers, rows, note))
    return out


def capacity_rows(capacity: CapacityResults | None) -> list[list[str]]:
    if capacity is None or capacity.table.empty:
        return []
    return [
        [fmt(r.get(c), kind) for c, _h, kind in CAPACITY_TABLE] for r in capacity.table.to_dict("records")
    ]


def sweep_headline(df: pd.DataFrame, capacity: CapacityResults | None) -> Headline:
    """The headline of the collected table (collect.headline), from its summary and capacity tables."""
    return headline(df, capacity.table if capacity is not None else None)


def write_report(
    df: pd.DataFrame,
    plots: list[tuple[str, Path]],
    out_dir: Path,
    capacity: CapacityResults | None = None,
    head: Headline | None = None,
    drawn: bool = True,
) -> Path:
    """report.html; ``drawn`` False: the figures were left out on purpose (``collect --no-plots``), and
    the report says so where they would stand."""
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    template = env.get_template("report.html.j2")
    figures = [{"title": title, "file": path.name, "src": _data_uri(path)} for title, path in plots]
    main = [f for f in figures if f["file"] == "pareto.png"]
    panels = [
        {**f, "key": f["file"].removeprefix("pareto_").removesuffix(".png")}
        for f in figures
        if f["file"].startswith("pareto_")
    ]
    by_cell = {f["file"]: f for f in figures if f["file"].startswith("capacity_")}
    steps = [
        CapacityPanel(found, by_cell.get(capacity_plot_name(found.exp_name)))
        for found in capacity_steps(capacity)
    ]
    placed = {f["file"] for f in [*main, *panels]} | {s.plot["file"] for s in steps if s.plot}
    html = template.render(
        title=f"agentsweep report — {_distinct(df, 'config_key')}",
        headline=head if head is not None else sweep_headline(df, capacity),
        interactivity_text=INTERACTIVITY_TEXT,
        identity=identity(df),
        column_sets=column_sets(df),
        rows=report_rows(df),
        problems=problem_cells(df),
        hit_headers=[
            "Cell",
            "Ideal",
            "GPU",
            "CPU/ext.",
            "Measured",
            "Measured / ideal",
            "Client-seen",
            "CPU tier hit",
            "CPU tier lookups from",
        ],
        hit_rows=hit_rows(df),
        main_plot=main[0] if main else None,
        pareto_panels=panels,
        plots=[f for f in figures if f["file"] not in placed],
        capacity_tiers=capacity_tiers(capacity),
        capacity_steps=steps,
        capacity_tier_headers=CAPACITY_TIER_HEADERS,
        capacity_headers=[h for _c, h, _k in CAPACITY_TABLE],
        capacity_rows=capacity_rows(capacity),
        figures_drawn=drawn,
        version=__version__,
    )
    return write_text(out_dir / "report.html", html)


def _md_escape(text: str) -> str:
    """Text as inert Markdown for the job summary: no HTML, no table breaks, one line."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|").replace("`", "'")


def headline_markdown(head: Headline) -> list[str]:
    """The headline as Markdown: per hardware and model, the tiers' and interactivity levels' tables."""
    lines: list[str] = []
    for group in head.groups:
        lines += [f"### {_md_escape(group.title)}", "", _md_escape(group.verdicts), ""]
        if group.note:
            lines += [_md_escape(group.note), ""]
        if group.tiers:
            lines += [
                "| SLO tier | Agents/GPU | Agents/MW | Best configuration | Bound by | How it was read |",
                "|---|---|---|---|---|---|",
            ]
            for t in group.tiers:
                if t.met:
                    config = t.configuration + (f" (and {t.ties} as many)" if t.ties else "")
                    cells = [t.description, t.agents, t.per_mw, config, t.binding, t.reading]
                else:
                    cells = [t.description, "none", "–", "no configuration meets it", t.binding, ""]
                lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
            lines.append("")
        lines += [
            f"Throughput per GPU on the frontier at each interactivity level ({_md_escape(INTERACTIVITY_TEXT)}):",
            "",
            "| Interactivity | Output tok/s/GPU | Total tok/s/GPU | Configuration | How |",
            "|---|---|---|---|---|",
        ]
        for level in group.levels:
            out = f"{level.output:,.1f}" if level.output is not None else "–"
            total = f"{level.total:,.0f}" if level.total is not None else "–"
            cells = [level.level_text, out, total, level.configuration or "–", level.how]
            lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
        lines.append("")
    return lines


def summary_markdown(
    df: pd.DataFrame,
    frontier: pd.DataFrame,
    capacity: CapacityResults | None = None,
    head: Headline | None = None,
) -> str:
    """A compact Markdown summary for $GITHUB_STEP_SUMMARY: the headline first, then the details."""
    lines = [f"## agentsweep — {_md_escape(_distinct(df, 'config_key'))}", ""]
    lines += headline_markdown(head if head is not None else sweep_headline(df, capacity))
    lines += ["### Sweep", ""]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {_md_escape(v)} |" for k, v in identity(df)] + [""]
    headers = [h for _c, h, _k in table_spec(df)]
    lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in table_rows(df)]
    problems = problem_cells(df)
    if problems:
        lines += ["", f"### {len(problems)} cell(s) not successful", ""]
        lines += [
            f"- **{_md_escape(p['exp_name'])}** ({p['status']}): {_md_escape(p['reason'])}" for p in problems
        ]
    sub = (
        frontier[
            (frontier["series_kind"] == "engine_offload")
            & (frontier["x_metric"] == "ttft_p50_s")
            & (frontier["y_metric"] == "output_tok_per_s_per_gpu")
        ]
        if not frontier.empty
        else frontier
    )
    if not sub.empty:
        kinds = "engine × offload × router × shape" if routed(df) else "engine × offload"
        lines += ["", f"### Best output tok/s/GPU on each {kinds} frontier (vs TTFT p50)", ""]
        for series, group in sub.groupby("series"):
            best = group.loc[group["y"].idxmax()]
            lines.append(
                f"- {series}: {best['y']:,.1f} tok/s/GPU at TTFT p50 {best['x']:.3f} s ({best['exp_name']})"
            )
    tiers = capacity_tiers(capacity)
    if tiers:
        lines += ["", "### Capacity under SLO", ""]
        for tier in tiers:
            lines += [f"**{_md_escape(tier.description)}**", ""]
            for config, agents, per_mw, _out, binding, reading in tier.rows:
                mw = f", {per_mw} agents/MW" if per_mw != "–" else ""
                text = f"{agents} agents/GPU{mw}: {config}, bound by {binding} ({reading})"
                lines.append(f"- {_md_escape(text)}")
            if tier.unmet:
                lines.append(f"- meets it nowhere measured: {_md_escape('; '.join(tier.unmet))}")
            lines.append("")
    lines.append("")
    return "\n".join(lines)
