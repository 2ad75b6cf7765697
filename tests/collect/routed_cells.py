"""Routed (scale-out) cell result directories in the documented formats (docs/scaleout.md).

A replicated cell has ``server_metrics.r<i>.csv`` per replica, their merge in ``server_metrics.csv``
and ``router.json`` with ``requests_by_replica``; a disaggregated one has ``p<i>``/``d<i>`` instances,
``server_metrics.csv`` = the decode instances merged, ``server_metrics.prefill.csv`` = the prefill
instances merged, and ``router.json`` with ``mode: "pd"``. Each instance's GPU hit rate over the
window is the ``hit`` it is written with.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from agentsweep.contract import cellresult
from agentsweep.contract.resultdir import RouterRecord
from agentsweep.metrics.dialects import COLUMNS
from agentsweep.metrics.scrapes import MEAN_COLUMNS

from .conftest import HIT, Spec, server_rows, write_cell

QUERIES = COLUMNS.index("prefix_cache_queries_total")
HITS = COLUMNS.index("prefix_cache_hits_total")


def instance_rows(spec: Spec, hit: float, load: float) -> list[list[str]]:
    """The synthetic scrapes with ``load`` times the queries and a window hit rate of ``hit``."""
    base = HIT[spec.offload][0]
    rows = []
    for row in server_rows(spec):
        row = list(row)
        row[QUERIES] = repr(float(row[QUERIES]) * load)
        row[HITS] = repr(float(row[HITS]) * load * hit / base)
        rows.append(row)
    return rows


def merged(tables: list[list[list[str]]]) -> list[list[str]]:
    """The instances merged row by row as the cell merges them (the scrapes share their times here):
    usage averaged, everything else summed."""
    out = []
    for rows in zip(*tables, strict=True):
        line = [rows[0][0]]
        for col in range(1, len(COLUMNS)):
            cells = [r[col] for r in rows]
            total = sum(float(c) for c in cells) if "" not in cells else None
            if total is not None and COLUMNS[col] in MEAN_COLUMNS:
                total /= len(cells)
            line.append("" if total is None else repr(total))
        out.append(line)
    return out


def write_csv(path: Path, rows: list[list[str]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows(rows)


def routed_cell(
    root: Path,
    spec: Spec,
    *,
    router: str = "cache_aware",
    hits: tuple[float, ...] = (0.5, 0.7),
    counts: tuple[float, ...] = (30.0, 10.0),
    router_json: dict[str, Any] | None = None,
    name: str | None = None,
) -> Path:
    """A replicated cell: one replica per entry of ``hits`` (tp each) behind ``router``."""
    replicas = len(hits)
    fields = spec.cell_fields()
    exp = name or f"{spec.exp_name}-r{replicas}-{router}"
    fields.update(
        exp_name=exp, replicas=replicas, router=router, router_program="smg", gpus=spec.tp * replicas
    )
    path = _written(root, spec, exp)
    _rewrite_cell_json(path, fields)
    tables = [instance_rows(spec, hit, 1.0 + i) for i, hit in enumerate(hits)]
    for i, table in enumerate(tables):
        write_csv(path / f"server_metrics.r{i}.csv", table)
    write_csv(path / "server_metrics.csv", merged(tables))
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(replicas)]
    doc = router_json or {
        "program": "smg",
        "version": "1.13.0",
        "policy": router,
        "policy_flag": router,
        "replicas": urls,
        "requests_by_replica": list(counts),
        "busiest_replica_share": max(counts) / sum(counts),
        "policy_branches": {"tree_match": 36.0, "expected_wait_fallback": 4.0},
        "mean_prefix_match_ratio": 0.83,
    }
    (path / "router.json").write_text(json.dumps(doc, indent=2) + "\n")
    return path


def pd_cell(
    root: Path,
    spec: Spec,
    *,
    prefill: tuple[int, int] = (1, 4),
    decode_hits: tuple[float, ...] = (0.2, 0.3),
    prefill_hit: float = 0.8,
    router: str = "round_robin",
    gpus_field: bool = False,
) -> Path:
    """A disaggregated cell: ``prefill`` (replicas, tp) and one decode instance (spec.tp) per hit."""
    fields = spec.cell_fields()
    decode = (len(decode_hits), spec.tp)
    label = f"p{prefill[0]}x{prefill[1]}-d{decode[0]}x{decode[1]}"
    exp = f"{spec.exp_name}-{label}-{router}"
    fields.update(
        exp_name=exp,
        router=router,
        router_program="vllm-router",
        prefill={"replicas": prefill[0], "tp": prefill[1]},
        decode={"replicas": decode[0], "tp": decode[1]},
    )
    if gpus_field:
        fields["gpus"] = prefill[0] * prefill[1] + decode[0] * decode[1]
    else:
        del fields["gpus"]  # follows from the roles
    path = _written(root, spec, exp)
    _rewrite_cell_json(path, fields)
    decode_tables = [instance_rows(spec, hit, 1.0 + i) for i, hit in enumerate(decode_hits)]
    prefill_tables = [instance_rows(spec, prefill_hit, 1.0) for _ in range(prefill[0])]
    for i, table in enumerate(decode_tables):
        write_csv(path / f"server_metrics.d{i}.csv", table)
    for i, table in enumerate(prefill_tables):
        write_csv(path / f"server_metrics.p{i}.csv", table)
    write_csv(path / "server_metrics.csv", merged(decode_tables))
    write_csv(path / "server_metrics.prefill.csv", merged(prefill_tables))
    doc = {
        "program": "vllm-router",
        "version": "0.1.17",
        "mode": "pd",
        "policy": router,
        "policy_flag": router,
        "prefill": [f"http://127.0.0.1:{9100 + i}" for i in range(prefill[0])],
        "decode": [f"http://127.0.0.1:{9200 + i}" for i in range(decode[0])],
        "requests_by_prefill": [40.0] * prefill[0],
        "requests_by_decode": [25.0, 15.0][: decode[0]],
    }
    (path / "router.json").write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _written(root: Path, spec: Spec, exp: str) -> Path:
    """The single-engine files of ``spec`` under ``root/agentic_<exp>`` (beside any cell of spec's name)."""
    path = write_cell(root / ".new", spec, server_metrics=False)
    return path.rename(root / f"agentic_{exp}")


def _rewrite_cell_json(path: Path, fields: dict[str, Any]) -> None:
    doc = json.loads((path / "cell.json").read_text())
    doc["cell"] = fields
    (path / "cell.json").write_text(json.dumps(doc, indent=1))


def count_router_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The result directories whose router.json a CellResult reads from now on, one entry a read."""
    reads: list[Path] = []
    read_router = cellresult.read_router

    def counted(result_dir: Path) -> RouterRecord | None:
        reads.append(result_dir)
        return read_router(result_dir)

    monkeypatch.setattr(cellresult, "read_router", counted)
    return reads
