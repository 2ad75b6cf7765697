"""The cell and collect jobs, run from the workflow files with artifacts laid out as GitHub lays them.

Upload and download are emulated with GitHub's rules: an upload's root is the common folder of its
paths (`!` lines exclude); a download by `pattern` puts each artifact in a folder named after it,
a download by `name` extracts into `path` itself.
"""

from __future__ import annotations

import csv
import fnmatch
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

SETUP = "$/.github/actions/setup"
Handler = Callable[[Mapping[str, Any], Mapping[str, str]], None]


def _noop(_with: Mapping[str, Any], _env: Mapping[str, str]) -> None:
    """checkout / setup: the workspace already links to this checkout and its virtualenv."""


def uploader(store: Path) -> Handler:
    """actions/upload-artifact into store/<name>/ (root = the common folder of the include paths)."""

    def upload(with_: Mapping[str, Any], _env: Mapping[str, str]) -> None:
        lines = [ln.strip() for ln in str(with_["path"]).splitlines() if ln.strip()]
        include = [Path(ln) for ln in lines if not ln.startswith("!")]
        exclude = [ln[1:] for ln in lines if ln.startswith("!")]
        files: list[Path] = []
        for path in include:
            if path.is_dir():
                files += [p for p in path.rglob("*") if p.is_file()]
            elif path.is_file():
                files.append(path)
        files = [f for f in files if not any(fnmatch.fnmatch(str(f), pat) for pat in exclude)]
        if not files:
            assert with_.get("if-no-files-found") in ("warn", "ignore"), f"{with_['name']}: no files"
            return
        root = Path(os.path.commonpath([p if p.is_dir() else p.parent for p in include]))
        target = store / with_["name"]
        assert with_.get("overwrite") is True or not target.exists(), f"{with_['name']} uploaded twice"
        for f in files:
            dest = target / f.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)

    return upload


def downloader(store: Path) -> Handler:
    """actions/download-artifact from store/ (pattern: one folder per artifact; name: into path)."""

    def download(with_: Mapping[str, Any], _env: Mapping[str, str]) -> None:
        dest = Path(with_["path"])
        dest.mkdir(parents=True, exist_ok=True)
        if with_.get("name"):
            shutil.copytree(store / with_["name"], dest, dirs_exist_ok=True)
            return
        for artifact in sorted(store.iterdir()):
            if fnmatch.fnmatch(artifact.name, with_["pattern"]):
                shutil.copytree(artifact, dest / artifact.name)

    return download


def _matrix_job(
    gha: SimpleNamespace, tmp_path: Path, store: Path, **given: Any
) -> tuple[dict[str, Any], Any]:
    workflow = gha.load_workflow("agentic-sweep.yml")
    inputs = gha.dispatch_inputs(workflow, given)
    temp = tmp_path / "temp-matrix"
    temp.mkdir()
    handlers = {"actions/checkout": _noop, SETUP: _noop, "actions/upload-artifact": uploader(store)}
    result = gha.run_job(workflow, "matrix", {"inputs": inputs}, tmp_path / "ws", temp, handlers)
    assert result.status == "success", [(s.name, s.output) for s in result.steps]
    return inputs, result


def _collect_job(
    gha: SimpleNamespace, tmp_path: Path, store: Path, inputs: dict[str, Any], matrix_result: Any
) -> Any:
    workflow, run_inputs, _ = gha.sweep_run(inputs, matrix_result.outputs)
    temp = tmp_path / "temp-collect"
    temp.mkdir()
    handlers = {
        "actions/checkout": _noop,
        SETUP: _noop,
        "actions/download-artifact": downloader(store),
        "actions/upload-artifact": uploader(store),
    }
    ctx = {"inputs": run_inputs, "needs": {"cells": {"result": "success"}}}
    return gha.run_job(workflow, "collect", ctx, tmp_path / "ws", temp, handlers, timeout=180)


def _summary_rows(store: Path) -> dict[str, dict[str, str]]:
    with (store / "agentic_aggregated" / "summary.csv").open(encoding="utf-8") as fh:
        return {row["exp_name"]: row for row in csv.DictReader(fh)}


@pytest.mark.slow
def test_collect_job_reports_failed_and_missing_cells(gha: SimpleNamespace, tmp_path: Path) -> None:
    """A FAILED cell (as the launcher leaves it) and a cell that never uploaded both become rows."""
    store = tmp_path / "artifacts-store"
    store.mkdir()
    gha.make_workspace(tmp_path / "ws")
    inputs, matrix_result = _matrix_job(gha, tmp_path, store, config_key="demo-mini", offload="off")
    (cell,) = json.loads(matrix_result.outputs["matrix"])["include"]
    other = {**cell, "exp_name": cell["exp_name"].replace("-off", "-noprefix"), "offload": "noprefix"}
    # The matrix expects two cells; only the first uploaded, and it failed before the replay.
    (store / "sweep_matrix" / "matrix.json").write_text(json.dumps({"include": [cell, other]}))
    failed = store / f"agentic_{cell['exp_name']}"
    failed.mkdir()
    reason = "engine did not become healthy within 600 s"
    (failed / "status.txt").write_text(f"FAILED\n{reason}\n")
    (failed / "cell.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "cell": cell,
                "engine_command": ["agentsweep", "engine-sim", cell["model"]],
                "engine_env": {},
                "replay_command": [],
                "versions": {"agentsweep": "0.1.0", "kv_cache_tester": "0.1.0", "engine": "sim"},
                "start_utc": "2026-01-01T00:00:00Z",
                "end_utc": "2026-01-01T00:10:00Z",
                "status": "FAILED",
                "reason": reason,
            }
        )
    )
    result = _collect_job(gha, tmp_path, store, inputs, matrix_result)
    collect = result.step("Collect")
    assert collect.returncode == 1, collect.output  # not every cell succeeded
    assert "Traceback" not in collect.output
    # The report is still in the job summary (once) and uploaded.
    summary_md = (store / "agentic_aggregated" / "summary.md").read_text(encoding="utf-8")
    assert result.summary.count(summary_md.strip()) == 1
    rows = _summary_rows(store)
    assert set(rows) == {cell["exp_name"], other["exp_name"]}
    assert rows[cell["exp_name"]]["status"] == "FAILED"
    assert reason in rows[cell["exp_name"]]["reason"]
    assert rows[other["exp_name"]]["status"] == "MISSING"


@pytest.mark.slow
def test_sweep_runs_end_to_end_through_the_workflow_files(gha: SimpleNamespace, tmp_path: Path) -> None:
    """matrix job -> one real cell through agentic-cell.yml on the local runner -> collect job."""
    store = tmp_path / "artifacts-store"
    store.mkdir()
    workspace = gha.make_workspace(tmp_path / "ws")
    inputs, matrix_result = _matrix_job(gha, tmp_path, store, config_key="demo-mini", duration=3)
    run_wf, run_inputs, run_secrets = gha.sweep_run(inputs, matrix_result.outputs)
    cell_wf = gha.load_workflow("agentic-cell.yml")
    cells = json.loads(matrix_result.outputs["matrix"])["include"]
    assert len(cells) == 3
    ran = next(c for c in cells if c["offload"] == "off")
    ctx = {"inputs": run_inputs, "matrix": ran, "secrets": run_secrets}
    call = run_wf["jobs"]["cells"]
    cell_inputs = gha.call_inputs(cell_wf, {k: gha.render(v, ctx) for k, v in call["with"].items()})
    secrets = {k: gha.render(v, ctx) for k, v in call["secrets"].items()}
    temp = tmp_path / "temp-cell"
    temp.mkdir()
    handlers = {"actions/checkout": _noop, SETUP: _noop, "actions/upload-artifact": uploader(store)}
    cell_result = gha.run_job(
        cell_wf, "cell", {"inputs": cell_inputs, "secrets": secrets}, workspace, temp, handlers, timeout=120
    )
    launch = cell_result.step("Run the cell")
    assert launch.returncode == 0, launch.output
    assert f"### {ran['exp_name']}" in cell_result.summary and "SUCCESS" in cell_result.summary
    artifact = store / f"agentic_{ran['exp_name']}"
    for name in ("cell.json", "status.txt", "requests.jsonl", "summary.json", "server_metrics.csv"):
        assert (artifact / name).is_file(), name
    assert json.loads((artifact / "cell.json").read_text())["cell"] == ran
    assert (store / f"serverlog_{ran['exp_name']}" / "server.log").is_file()

    result = _collect_job(gha, tmp_path, store, inputs, matrix_result)
    assert result.step("Collect").returncode == 1  # two cells of the matrix never ran
    rows = _summary_rows(store)
    assert set(rows) == {c["exp_name"] for c in cells}
    assert rows[ran["exp_name"]]["status"] == "SUCCESS"
    assert {rows[c["exp_name"]]["status"] for c in cells if c is not ran} == {"MISSING"}
    aggregated = store / "agentic_aggregated"
    assert (aggregated / "report.html").is_file() and (aggregated / "frontier.csv").is_file()
    assert ran["exp_name"] in result.summary


@pytest.mark.slow
def test_collect_job_stores_the_sweep_and_its_dashboard(gha: SimpleNamespace, tmp_path: Path) -> None:
    """The cells that carry a receipt go into the results_store artifact's SQLite store, with the
    dashboard beside it; a cell without one is named and left out."""
    from agentsweep.store import query
    from agentsweep.store.db import Store

    from ..store.conftest import SMALL, make_sweep

    store = tmp_path / "artifacts-store"
    store.mkdir()
    gha.make_workspace(tmp_path / "ws")
    inputs, matrix_result = _matrix_job(gha, tmp_path, store, config_key="demo-mini", offload="off")
    paths = make_sweep(store, SMALL[:2])
    (paths[1] / "receipt.json").unlink()
    result = _collect_job(gha, tmp_path, store, inputs, matrix_result)
    step = result.step("Store the sweep and render its dashboard")
    assert step.returncode == 0, step.output
    assert f"{paths[1].name}/receipt.json: no receipt; not ingested" in step.output
    kept = store / "results_store"
    assert (kept / "dashboard" / "index.html").is_file()
    db = Store.open(str(kept / "agentsweep.db"))
    with db.read() as conn:
        points = query.load_points(conn)
        runs = query.list_runs(conn)
    db.dispose()
    assert [p.exp_name for p in points] == [SMALL[0].exp_name]
    assert len(runs) == 1 and runs[0].label.startswith("run ")
