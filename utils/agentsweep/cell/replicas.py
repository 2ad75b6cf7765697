"""What a routed cell's instances and router leave behind, combined after the replay.

Every instance behind a router is scraped on its own (``server_metrics.<name>.csv``); after the
replay the rows of the instances that answer the client (the replicas, or the decode instances) are
merged into ``server_metrics.csv``: counters and request counts summed, usage fractions averaged, so
the validity checks that compare client sums with server counters hold as for one engine. The
prefill instances are merged the same way into ``server_metrics.prefill.csv``. The router's own
per-instance request counts go to ``router.json``.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentsweep.cell import record
from agentsweep.cell.plan import CellPlan
from agentsweep.cell.routers import router_recipe, router_version
from agentsweep.metrics.dialects import COLUMNS

# Averaged over the replicas (each reports the fraction of its own pool); every other column is summed.
MEAN_COLUMNS = frozenset({"kv_cache_usage", "cpu_kv_cache_usage"})
ROUTER_METRICS_MAX_BYTES = 8 << 20
ROUTER_SNAPSHOT_MAX_BYTES = 1 << 20


def router_figures(plan: CellPlan, metrics_text: str) -> dict[str, Any]:
    """What router.json says of the router's routing, from its /metrics text.

    Data-parallel: requests per replica and the busiest one's share. Prefill/decode: requests per
    prefill and per decode instance (both routers count each instance under its URL) and the busiest
    share of each role.
    """
    assert plan.router is not None
    program = router_recipe(plan.router.program)
    by_worker = program.requests_by_worker(metrics_text)
    figures: dict[str, Any] = {}
    groups = (
        [("prefill", plan.prefill), ("decode", plan.decode)]
        if plan.mode == "pd"
        else [("replica", plan.instances)]
    )
    for role, members in groups:
        counts = [by_worker.get(r.url, 0.0) for r in members]
        total = sum(counts)
        figures[f"requests_by_{role}"] = counts
        figures[f"busiest_{role}_share"] = max(counts) / total if total else None
    figures.update(program.affinity(metrics_text))
    return figures


def write_router_figures(plan: CellPlan, result_dir: Path) -> None:
    """router.json: the router's requests per instance (and its metrics text, histograms left out)."""
    router = plan.router
    assert router is not None
    figures: dict[str, Any] = {
        "program": router.program,
        "version": router_version(router.program),
        "mode": plan.mode,
        "policy": plan.cell.router,
        "policy_flag": router_recipe(router.program).policy_name(plan.cell.router),
    }
    if plan.mode == "pd":
        figures["prefill"] = [r.url for r in plan.prefill]
        figures["decode"] = [r.url for r in plan.decode]
    else:
        figures["replicas"] = [r.url for r in plan.instances]
    try:
        with urllib.request.urlopen(router.metrics_url, timeout=5.0) as resp:
            text = resp.read(ROUTER_METRICS_MAX_BYTES).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        figures["error"] = f"cannot read {router.metrics_url}: {err}"
    else:
        figures.update(router_figures(plan, text))
        kept = "".join(
            line + "\n"
            for line in text.splitlines()
            if line and "_bucket{" not in line and not line.startswith("#")
        )
        record.write_atomic(result_dir / "router_metrics.txt", kept[:ROUTER_SNAPSHOT_MAX_BYTES])
    record.write_atomic(result_dir / "router.json", json.dumps(figures, indent=2) + "\n")


def _read_rows(path: Path) -> list[list[str]]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except FileNotFoundError:
        return []
    if not rows or tuple(rows[0]) != COLUMNS:
        return []
    return [row for row in rows[1:] if len(row) == len(COLUMNS)]


def merge_metrics(inputs: Sequence[Path], output: Path) -> int:
    """Write ``output`` (server_metrics.csv) from per-replica CSVs; returns the rows written.

    Rows are matched to the first replica's scrape times (the nearest row of every other replica,
    the last rows with each other). A time some replica has no row near is left out rather than
    written with that replica missing; an empty figure in any replica leaves the merged figure empty.
    """
    tables = [_read_rows(p) for p in inputs]
    out_rows: list[list[str]] = []
    if tables and all(tables):
        times = [[float(row[0]) for row in table] for table in tables]
        gaps = [b - a for t in times for a, b in itertools.pairwise(t)]
        tolerance = 0.75 * (sorted(gaps)[len(gaps) // 2] if gaps else 1.0)
        ref = tables[0]
        for k, row in enumerate(ref):
            t = float(row[0])
            last = k == len(ref) - 1
            picks = [row]
            for table, ts in zip(tables[1:], times[1:], strict=True):
                j = len(ts) - 1 if last else _nearest(ts, t)
                if not last and abs(ts[j] - t) > tolerance:
                    break
                picks.append(table[j])
            else:
                out_rows.append(_combine(picks))
    tmp = output.with_suffix(".csv.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows(out_rows)
    tmp.replace(output)
    return len(out_rows)


def _nearest(ts: list[float], t: float) -> int:
    i = bisect.bisect_left(ts, t)
    if i == 0:
        return 0
    if i == len(ts):
        return len(ts) - 1
    return i if ts[i] - t < t - ts[i - 1] else i - 1


def _combine(rows: Sequence[list[str]]) -> list[str]:
    out = [rows[0][0]]
    for col, name in enumerate(COLUMNS[1:], start=1):
        cells = [row[col] for row in rows]
        if any(c == "" for c in cells):
            out.append("")
            continue
        values = [float(c) for c in cells]
        value = float(sum(values) / len(values) if name in MEAN_COLUMNS else sum(values))
        out.append(str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value))
    return out
