"""Power sampling of a cell spanning two nodes of a real Slurm allocation (`slurm_cluster2`): the
simulated engines' DCGM metrics read on both nodes through the launcher, and a GPU tool run in a job
step on each node for exactly the cell's GPUs there."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from agentsweep.cell.placement import plan_placement
from agentsweep.cell.power import sampler_spec
from agentsweep.config import load_runners, select_cells
from agentsweep.energy.powercsv import read_power
from agentsweep.energy.sampler import sample
from agentsweep.energy.summary import Window, Work, power_summary, summarize

from .test_slurm_multinode import (
    REPO,
    SWEEP,
    _assert_steps_on_both_nodes,
    _launch_on_two_nodes,
    allocate,
    engine_sim_ready,
    runners_file,
)

STANDIN = REPO / "tests" / "energy" / "standin" / "nvidia_smi.py"


def power_cell(tmp_path: Path, *, replicas: int, gpus_per_node: int, source: str = "nvidia-smi"):  # type: ignore[no-untyped-def]
    runners = runners_file(tmp_path / "runners.yaml", gpus_per_node, max_nodes=2)
    runners.write_text(
        runners.read_text().replace("}\n", f", power_source: {source}, power_interval_s: 0.25}}\n")
    )
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP.format(duration=8, tp=1, replicas=replicas))
    (cell,) = select_cells(sweep, ["mn"], runners=load_runners(runners))
    assert cell.node.power_source == source and cell.nodes == 2
    return cell, runners


@pytest.mark.slurm
@pytest.mark.slow
def test_two_node_simulated_cell_samples_both_nodes(slurm2, tmp_path):
    if not engine_sim_ready():
        pytest.skip("the repository's .venv or benchmarks/run_cell.sh is missing")
    cell, runners = power_cell(tmp_path, replicas=2, gpus_per_node=1)
    result = tmp_path / "result"
    job, seen = _launch_on_two_nodes(slurm2, cell, runners, result)
    _assert_steps_on_both_nodes(job, seen)
    assert (result / "status.txt").read_text().splitlines()[0] == "SUCCESS"
    rows = read_power(result / "power.csv")
    assert [r.fault for r in rows if r.fault] == []
    assert {(r.node, r.gpu) for r in rows} == {("gpunode1", "r0/0"), ("gpunode2", "r1/0")}
    summary = power_summary(result)
    assert summary.power_valid, summary.reasons
    assert summary.audit.expected_gpus == summary.audit.observed_gpus == 2
    assert {g.node for g in summary.per_gpu} == {"gpunode1", "gpunode2"}
    assert summary.joules_per_output_token and summary.joules_per_output_token > 0
    assert slurm2.jobs() == []


@pytest.mark.slurm
def test_a_gpu_tool_runs_in_a_step_on_each_node_for_the_cells_gpus_there(slurm2, tmp_path, monkeypatch):
    """Three instances of one GPU on nodes of two GPUs: two on node 0, one on node 1. The tool runs on
    each node in a step that keeps those GPUs, and only they are sampled."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    tool.chmod(0o755)
    monkeypatch.setenv("SLURM_CONF", slurm2.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{slurm2.env['PATH']}")
    cell, _ = power_cell(tmp_path, replicas=3, gpus_per_node=2)
    cell = cell.replace(engine="vllm", speed=1.0)  # a real engine's cell: the node's own GPU tool
    job = allocate(slurm2, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:h200:2")
    try:
        environ = {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "gpunode1", "SLURM_CONF": slurm2.env["SLURM_CONF"]}
        placement = plan_placement(cell, gpus_per_node=2, gres_type="h200", vendor="nvidia", environ=environ)
        assert placement is not None
        instances = [
            (f"r{i}", s.node, s.tp, f"http://{s.address}:1/metrics") for i, s in enumerate(placement.slots)
        ]
        spec = sampler_spec(
            cell, instances, [{}] * 3, placement, environ, simulated=False, local_node="gpunode1"
        )
        assert spec is not None and spec.source == "nvidia-smi"
        assert [(t.node, t.count) for t in spec.targets] == [("gpunode1", 2), ("gpunode2", 1)]
        start = time.time()
        sample(spec, tmp_path / "power.csv", 8.0)
        end = time.time()
    finally:
        slurm2.run("scancel", job)
    rows = read_power(tmp_path / "power.csv")
    assert [r.fault for r in rows if r.fault] == []
    assert {(r.node, r.gpu) for r in rows} == {("gpunode1", "0"), ("gpunode1", "1"), ("gpunode2", "0")}
    first = min(r.time_s for r in rows)
    summary = summarize(
        rows, window=Window(first + 0.5, end - 0.5), expected_gpus=3, interval_s=0.25, work=Work(), source="t"
    )
    assert summary.power_valid, summary.reasons
    assert start < first < end
