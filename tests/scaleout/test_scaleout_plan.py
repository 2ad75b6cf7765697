"""The resolved commands of scale-out cells (what --dry-run prints), per engine and hardware."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentsweep.cell.plan import plan_cell
from agentsweep.cell.port_allocation import DryRunPortAllocator
from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError

BASE = {
    "exp_name": "x-r2", "tp": 2, "users": 4, "offload": "on", "cpu_dram_gb": 384.0, "replicas": 2,
    "router": "cache_aware", "image": "img", "model": "m", "precision": "fp8", "duration": 60, "traces": "t",
}  # fmt: skip


def _plan(engine: str, hardware: str | None, environ: dict[str, str], tmp_path: Path, **over: object):
    cell = Cell.parse({**BASE, "engine": engine, "hardware": hardware or "", **over})
    return plan_cell(cell, tmp_path, ports=DryRunPortAllocator(), python="py", environ=environ)


def test_vllm_replicas_split_the_allocated_gpus_and_the_offload_budget(tmp_path: Path) -> None:
    plan = _plan("vllm", "h200", {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, tmp_path)
    assert plan.router is not None
    reps = plan.instances
    assert [r.engine.env["CUDA_VISIBLE_DEVICES"] for r in reps] == ["4,5", "6,7"]
    for rep in reps:
        argv = rep.engine.argv
        assert argv[:3] == ["vllm", "serve", "m"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
        assert argv[argv.index("--kv-offloading-size") + 1] == "192"  # half the cell's 384 GiB
    router = plan.router.argv
    assert router[:3] == ["py", "-m", "vllm_router.launch_router"]
    assert router[router.index("--worker-urls") + 1 : router.index("--policy")] == [r.url for r in reps]
    assert plan.base_url == "http://127.0.0.1:$PORT"  # the replayer talks to the router
    assert plan.replay_argv[plan.replay_argv.index("--api-endpoint") + 1] == plan.base_url
    shown = "\n".join(plan.describe())
    assert (
        "replica 1: CUDA_VISIBLE_DEVICES=6,7 vllm serve m" in shown and "router:  py -m vllm_router" in shown
    )


def test_sglang_on_mi355x_gets_smg_and_hip_devices(tmp_path: Path) -> None:
    plan = _plan("sglang", "mi355x", {}, tmp_path, router="consistent_hash")
    assert plan.router is not None
    assert [r.engine.env["HIP_VISIBLE_DEVICES"] for r in plan.instances] == ["0,1", "2,3"]
    router = plan.router
    assert router.program == "smg" and router.ready_path == "/readiness"
    assert router.argv[router.argv.index("--policy") + 1] == "consistent_hashing"


def test_simulated_replicas_get_no_device_variables(tmp_path: Path) -> None:
    plan = _plan("sim", "h200", {"CUDA_VISIBLE_DEVICES": "0"}, tmp_path, image="")
    assert plan.router is not None
    assert all("CUDA_VISIBLE_DEVICES" not in r.engine.env for r in plan.instances)


def test_too_few_visible_gpus_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        InputError, match=r"2 replicas x tp 2 need 4 GPUs but CUDA_VISIBLE_DEVICES=0,1 shows 2"
    ):
        _plan("vllm", "h200", {"CUDA_VISIBLE_DEVICES": "0,1"}, tmp_path)


def test_single_engine_plan_is_unchanged(tmp_path: Path) -> None:
    plan = _plan("vllm", "h200", {}, tmp_path, replicas=1, router="", cpu_dram_gb=192.0)
    assert plan.router is None
    assert plan.describe()[0].startswith("engine:  vllm serve m")
