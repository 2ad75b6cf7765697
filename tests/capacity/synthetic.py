"""A capacity cell's result directory written without running anything: its steps are collect's
synthetic cells (tests/collect/conftest.py) at the counts the real search picks, each a result
directory with its own receipt; capacity.json is what the real search says of them
(``agentsweep.capacity.search``); the cell's verdict and receipt come last, as the cell writes them.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentsweep.capacity.measure import run_figures
from agentsweep.capacity.search import next_users, tier_results
from agentsweep.capacity.steps import step_cell
from agentsweep.cell import record
from agentsweep.contract.cell import Cell
from agentsweep.contract.receipt import write_receipt
from agentsweep.contract.resultdir import CapacityRecord, StepRecord, step_dir, write_capacity
from agentsweep.contract.resultdir.capacity import StopReason
from agentsweep.contract.verdict import Verdict
from agentsweep.metrics.dialects import COLUMNS

from ..collect.conftest import Spec, requests_lines, server_rows, summary_json

ENGINE_VERSION = "sim-1.0"
COMMIT = "c0ffee" + "0" * 34
# The synthetic steps' TTFT p90 grows with the users (0.14 s at 1 user, 0.24 s at 4, 0.37 s at 8):
# searching 1..8, roomy holds at 8 ("at least"), snappy ends between 4 and 8 (a smooth boundary).
TIERS = [
    {"name": "roomy", "constraints": ["ttft p90 <= 1000 s"]},
    {"name": "snappy", "constraints": ["ttft p90 <= 0.3 s"]},
]


def capacity_cell(low: int = 1, high: int = 8, *, duration: int = 60, **capacity: Any) -> Cell:
    """The capacity cell of collect's synthetic series (sim, tp1, offload on) searching low..high."""
    fields = Spec(users=high).cell_fields()
    fields.update(
        exp_name=f"demo-tp1-ep1-u{low}to{high}-on",
        duration=duration,
        capacity={"low": low, "high": high, "time_limit_min": 60, "tiers": TIERS, **capacity},
    )
    return Cell.parse(fields)


def write_step(result_dir: Path, cell: Cell, index: int, users: int, status: Verdict = "SUCCESS") -> Cell:
    """steps/<index>/ of ``cell`` at ``users``: collect's synthetic run, the step's verdict, its receipt."""
    step = step_cell(cell, index, users)
    sdir = step_dir(result_dir, index)
    sdir.mkdir(parents=True)
    spec = Spec(users=users, duration=float(cell.duration))
    if status != "FAILED":
        (sdir / "summary.json").write_text(json.dumps(summary_json(spec)))
        (sdir / "requests.jsonl").write_text("\n".join(requests_lines(spec)) + "\n")
        with (sdir / "server_metrics.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(COLUMNS)
            writer.writerows(server_rows(spec))
    reasons = {"SUCCESS": [], "INVALID": ["window_requests: too few"], "FAILED": ["interrupted by SIGTERM"]}
    _verdict(sdir, step, status, reasons[status])
    return step


def _verdict(path: Path, cell: Cell, status: Verdict, reasons: Sequence[str], receipt: bool = True) -> None:
    record.write_result(
        path,
        cell=cell.model_dump(mode="json"),
        engine_command=["agentsweep", "engine-sim", cell.model],
        engine_env={},
        replay_command=["kv-cache-tester", "replay"],
        versions={"agentsweep": "0.1.0", "kv_cache_tester": "0.1.0", "engine": ENGINE_VERSION},
        start_utc="2026-01-01T00:00:00Z",
        end_utc="2026-01-01T00:01:10Z",
        status=status,
        reasons=reasons,
    )
    if receipt:
        fields = record.mask_cell(cell.model_dump(mode="json"))
        write_receipt(path, fields, engine_version=ENGINE_VERSION, commit=COMMIT)


def capacity_dir(
    root: Path,
    cell: Cell | None = None,
    *,
    steps: int | None = None,
    statuses: Callable[[int, int], Verdict] = lambda index, users: "SUCCESS",
    ended: StopReason | None = None,
    verdict: Verdict = "SUCCESS",
    reasons: Sequence[str] = (),
    seal: bool = True,
) -> Path:
    """A capacity cell's result directory in the artifact layout: the search's steps in order (all of
    them, or the first ``steps``; one run per count), each with the verdict ``statuses(index, users)`` gives, then
    capacity.json (``ended``: how the search stopped early), the cell's verdict and receipt."""
    cell = cell or capacity_cell()
    spec = cell.capacity
    assert spec is not None
    path = root / f"agentic_{cell.exp_name}"
    path.mkdir(parents=True)
    done: list[StepRecord] = []
    while (users := next_users(spec, done)) is not None and (steps is None or len(done) < steps):
        index = len(done)
        status = statuses(index, users)
        step = write_step(path, cell, index, users, status)
        figures = run_figures(step_dir(path, index), step, spec.constraints)
        done.append(
            StepRecord(
                index=index,
                users=users,
                dir=f"steps/{index}",
                exp_name=step.exp_name,
                status=status,
                reasons=() if status == "SUCCESS" else ("see status.txt",),
                statistics=figures.statistics,
                output_tok_per_s_per_gpu=figures.output_tok_per_s_per_gpu,
                total_tok_per_s_per_gpu=figures.total_tok_per_s_per_gpu,
                wall_s=70.0,
            )
        )
    write_capacity(path, search_record(cell, done, ended))
    _verdict(path, cell, verdict, reasons, receipt=seal)
    return path


def search_record(cell: Cell, steps: Sequence[StepRecord], ended: StopReason | None = None) -> CapacityRecord:
    """capacity.json as the cell writes it for ``steps``."""
    spec = cell.capacity
    assert spec is not None
    reason, tiers = tier_results(spec, steps, gpus=cell.gpus, ended=ended)
    return CapacityRecord(
        exp_name=cell.exp_name,
        gpus=cell.gpus,
        low=spec.low,
        high=spec.high,
        resolution=spec.resolution,
        repeats=spec.repeats,
        cliff_factor=spec.cliff_factor,
        time_limit_s=spec.time_limit_min * 60.0,
        step_budget=40,
        stop_reason=reason,
        engine_s=500.0,
        tiers=tuple(tiers),
        steps=tuple(steps),
    )


def reseal(path: Path) -> None:
    """The capacity cell's receipt written again over what its directory holds now (as if the cell
    had written it so): a test that changes capacity.json tests the reader, not the receipt."""
    doc = json.loads((path / "cell.json").read_text())
    write_receipt(path, doc["cell"], engine_version=ENGINE_VERSION, commit=COMMIT)
