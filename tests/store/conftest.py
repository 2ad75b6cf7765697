"""Result directories with receipts, and the two store backends the same tests run against.

The cells are collect's synthetic ones (tests/collect/conftest.py), given an end time per request
and, where a test asks, a stability block; each gets its receipt as the cell would write it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from agentsweep.contract.cell import Cell
from agentsweep.contract.receipt import write_receipt

from ..collect.conftest import GRID, Spec, write_cell
from .postgres import PostgresServer, running_postgres

COMMIT = "c0ffee" + "0" * 34


def _with_done_times(path: Path) -> None:
    """Give every synthetic record a t_done (dispatch + E2E), as the replayer writes it."""
    lines = []
    for line in (path / "requests.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec["t_done"] = rec["t_dispatch"] + (rec["e2e_s"] or 1.0)
        lines.append(json.dumps(rec))
    (path / "requests.jsonl").write_text("\n".join(lines) + "\n")


def scale_summary(path: Path, throughput: float = 1.0, latency: float = 1.0) -> None:
    """Multiply a cell's throughputs and latencies (another run's figures for the same cell)."""
    summary = json.loads((path / "summary.json").read_text())
    for key, value in summary["throughput"].items():
        if isinstance(value, float | int):
            summary["throughput"][key] = value * throughput
    for metric, dist in summary["latency"].items():
        for stat, value in dist.items():
            factor = 1 / latency if metric.startswith("interactivity") else latency
            dist[stat] = value * factor
    (path / "summary.json").write_text(json.dumps(summary))


def add_stability(path: Path, spread: float) -> dict[str, float]:
    """A stability block whose sub-window p90 TTFT, E2E and interactivity vary by +-spread."""
    summary = json.loads((path / "summary.json").read_text())
    lat = summary["latency"]
    block: dict[str, Any] = {"observed_window_count": 3}
    for key, name in (("ttft", "ttft_s"), ("e2el", "e2e_s"), ("intvty", "interactivity_tok_per_s")):
        for stat in ("p75", "p90"):
            center = lat[name].get(stat, lat[name]["p90"])
            block[f"observed_window_{stat}_{key}_min"] = center * (1 - spread)
            block[f"observed_window_{stat}_{key}_max"] = center * (1 + spread)
    summary["stability"] = block
    (path / "summary.json").write_text(json.dumps(summary))
    return block


def seal(path: Path, engine_version: str = "sim-1.0", commit: str = COMMIT) -> None:
    """Write the receipt, as the cell does last."""
    cell = Cell.parse(json.loads((path / "cell.json").read_text())["cell"])
    write_receipt(path, cell, engine_version=engine_version, commit=commit)


def make_sweep(
    root: Path,
    specs: Sequence[Spec] = GRID,
    *,
    failed: Sequence[str] = (),
    throughput: float = 1.0,
    latency: float = 1.0,
    stability: float | None = None,
    engine_version: str = "sim-1.0",
    start_utc: str = "2026-01-01T00:00:00Z",
) -> list[Path]:
    """A sweep in the download-artifact layout, every cell with its receipt."""
    paths = []
    for spec in specs:
        bad = spec.exp_name in failed
        path = write_cell(
            root, spec, status="FAILED" if bad else "SUCCESS", reason="engine OOM" if bad else None
        )
        doc = json.loads((path / "cell.json").read_text())
        doc["start_utc"] = start_utc
        doc["versions"]["engine"] = engine_version
        (path / "cell.json").write_text(json.dumps(doc, indent=1))
        if not bad:
            _with_done_times(path)
            if throughput != 1.0 or latency != 1.0:
                scale_summary(path, throughput, latency)
            if stability is not None:
                add_stability(path, stability)
        seal(path, engine_version)
        paths.append(path)
    return paths


SMALL = [Spec(tp=1, users=u, offload=o) for u in (2, 8) for o in ("on", "off")]


@pytest.fixture(autouse=True)
def ingest_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ingest reads result directories in the main process here (no worker processes); the test
    that runs the workers says so and is marked slow."""
    monkeypatch.setenv("AGENTSWEEP_INGEST_WORKERS", "1")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer | None]:
    with running_postgres() as server:
        yield server


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)],
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store: a SQLite file, or a database on a real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    server = request.getfixturevalue("postgres_server")
    if server is None:
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql; .ci/apt-packages.txt)")
    return server.new_database()
