"""A store of two nightly runs (one changed, one INVALID cell, a routed cell) and its dashboard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.cli import main

from ..collect.conftest import WINDOW_START, Spec
from ..collect.routed_cells import routed_cell
from ..store.conftest import make_sweep, seal

SPECS = [Spec(tp=tp, users=u, offload=o) for tp in (1, 2) for u in (2, 8, 32) for o in ("on", "off")]
INVALID = "demo-tp1-ep1-u8-off"


def make_invalid(path: Path) -> None:
    """Turn a SUCCESS cell into an INVALID one with a failed check, as the cell writes it."""
    reason = "throughput_drift: output tok/s per third 1923 / 246 / 796"
    doc = json.loads((path / "cell.json").read_text())
    doc["status"], doc["reason"] = "INVALID", reason
    (path / "cell.json").write_text(json.dumps(doc, indent=1))
    (path / "status.txt").write_text(f"INVALID\n{reason}\n")
    summary = json.loads((path / "summary.json").read_text())
    summary["validity"] = {
        "valid": False,
        "reasons": [reason],
        "checks": {
            "failed_share": {"value": 0.0, "limit": 0.02, "ok": True},
            "throughput_drift": {"value": 1.37, "limit": 0.5, "ok": False, "reason": reason},
        },
    }
    (path / "summary.json").write_text(json.dumps(summary))


def add_routed(root: Path) -> Path:
    path = routed_cell(root, Spec(tp=1, users=8, offload="on"))
    rows = ["time_s,requests.r0,requests.r1"]
    for i in range(70):
        rows.append(f"{WINDOW_START - 5 + i:.3f},{i * 0.45:g},{i * 0.15:g}")
    (path / "router_metrics.csv").write_text("\n".join(rows) + "\n")
    lines = []
    for line in (path / "requests.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec["t_done"] = rec["t_dispatch"] + (rec["e2e_s"] or 1.0)
        lines.append(json.dumps(rec))
    (path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    seal(path)
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(store file, dashboard folder)."""
    tmp = tmp_path_factory.mktemp("dash")
    night1, night2 = tmp / "night1", tmp / "night2"
    make_sweep(night1, SPECS, stability=0.05)
    add_routed(night1)
    paths = make_sweep(night2, SPECS, throughput=0.7, latency=1.3, start_utc="2026-01-02T00:00:00Z")
    invalid = next(p for p in paths if p.name == f"agentic_{INVALID}")
    make_invalid(invalid)
    seal(invalid)
    db = tmp / "store.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTSWEEP_INGEST_WORKERS", "1")  # no worker processes
        for label, root in (("night1", night1), ("night2", night2)):
            assert main(["results", "ingest", "--db", str(db), str(root), "--label", label]) == 0
    out = tmp / "site"
    assert main(["dashboard", "--db", str(db), "-o", str(out)]) == 0
    return db, out
