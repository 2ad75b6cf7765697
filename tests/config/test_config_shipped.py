"""The shipped configs/agentic.yaml and configs/runners.yaml: every key validates and expands."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from agentsweep.config import expand, load_runners, load_sweep
from agentsweep.config.loader import read_config_file
from agentsweep.contract.cell import CELL_FIELDS, HARDWARE, Cell
from pydantic import ValidationError

CONTRACT_FIELDS = {
    "config_key": str, "exp_name": str, "runner": str, "engine": str, "model": str, "precision": str,
    "image": str, "image_digest": str, "tp": int, "ep": int, "gpus": int, "users": int, "offload": str, "cpu_dram_gb": float,
    "offload_connector": str, "duration": int, "traces": str, "max_context": int, "max_delay": float,
    "advance_min": float, "advance_max": float, "timing_strategy": str, "ignore_eos": bool, "seed": int,
    "warmup_requests": int, "warmup_one_token": bool, "system_idle_cap": float,
    "failed_request_threshold": float, "api": str, "speed": float, "clock": str, "engine_args": str, "engine_env": str,
    "client": str,
    "max_failed_share": float, "max_context_error_share": float, "min_window_coverage": float,
    "min_window_requests": int,
    "max_lane_idle_s": float, "max_dispatch_lag_p99_s": float, "max_client_cpu_share": float,
    "max_client_clock_share": float,
    "max_request_count_gap": float, "max_prompt_token_gap": float, "max_cached_token_gap": float,
    "max_throughput_drift": float, "preset": str, "replicas": int, "router": str, "router_program": str,
    "router_args": str, "client_nodes": int, "infmax_model_prefix": str, "accuracy": dict, "prefill": type(None),
    "decode": type(None), "nodes": int,
    "capacity": type(None),
    "hardware": str, "gres_type": str, "gpus_per_node": int, "intra_node_gbs": float, "inter_node_gbs": float,
    "power_source": str, "power_endpoint": str, "power_interval_s": float,
}  # fmt: skip
SHIPPED_KEYS = read_config_file(None).keys()


def test_runners_file_has_the_four_runners_and_their_launchers(repo_root: Path) -> None:
    runners = load_runners(repo_root / "configs" / "runners.yaml")
    simulated = {key: spec for key, spec in runners.items() if key.startswith("sim-")}
    runners = {key: spec for key, spec in runners.items() if key not in simulated}
    assert set(runners) == {"h200", "b200", "mi355x", "local"}
    for key, spec in runners.items():
        assert spec.launcher == f"runners/launch_{key}.sh"
        assert spec.gpus_per_node == 8
        assert spec.cpu_dram_gb > 0
        assert spec.runs_on
    assert {k: r.gres_type for k, r in runners.items()} == {
        "h200": "h200",
        "b200": "b200",
        "mi355x": "mi355x",
        "local": None,
    }
    assert {k: r.container_runtime for k, r in runners.items()} == {
        "h200": "pyxis", "b200": "pyxis", "mi355x": "docker", "local": "none",
    }  # fmt: skip
    assert {k: r.hardware for k, r in runners.items()} == {
        "h200": "h200", "b200": "b200", "mi355x": "mi355x", "local": "h200",
    }  # fmt: skip
    # A simulated node of every GPU the simulated engine has a profile of, run on this machine.
    assert {spec.hardware for spec in simulated.values()} == set(HARDWARE)
    for key, spec in simulated.items():
        assert key == f"sim-{spec.hardware}"
        assert (spec.launcher, spec.container_runtime, spec.gres_type) == (
            "runners/launch_local.sh",
            "none",
            None,
        )
        assert spec.gpus_per_node == (72 if spec.hardware in ("gb200", "gb300") else 8)
        assert spec.cpu_dram_gb > 0 and spec.power_source == "dcgm"


def test_runners_env_variable_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo_root: Path
) -> None:
    alt = tmp_path / "r.yaml"
    alt.write_text(
        (repo_root / "configs" / "runners.yaml").read_text().replace("cpu_dram_gb: 2048", "cpu_dram_gb: 32")
    )
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", str(alt))
    assert load_runners()["local"].cpu_dram_gb == 32


@pytest.mark.parametrize("key", SHIPPED_KEYS)
def test_every_shipped_key_validates_and_expands(key: str) -> None:
    spec = load_sweep(None, key)
    runners = load_runners()
    cells = expand(spec, runners)
    assert cells, key
    names = [c.exp_name for c in cells]
    assert len(set(names)) == len(names)
    for cell in cells:
        assert tuple(cell.to_dict()) == CELL_FIELDS
        data = cell.flat()  # summary.csv's cell columns
        roles = {"prefill": dict, "decode": dict} if cell.disaggregated else {}
        if cell.capacity is not None:
            roles["capacity"] = dict
        assert {k: type(v) for k, v in data.items()} == {**CONTRACT_FIELDS, **roles}
        assert re.fullmatch(r"[A-Za-z0-9._-]+", cell.exp_name)
        routed = f"-r{cell.replicas}-{cell.router}" if cell.router else ""
        if cell.prefill is not None and cell.decode is not None:
            routed = f"-p{cell.prefill.label}-d{cell.decode.label}-{cell.router}"
        users = f"{cell.capacity.low}to{cell.capacity.high}" if cell.capacity is not None else cell.users
        assert cell.exp_name == f"{key}-tp{cell.tp}-ep{cell.ep}-u{users}-{cell.offload}{routed}"
        assert cell.gpus == sum(cell.instance_tps)
        assert cell.gpus <= runners[cell.runner].gpus_per_node * cell.nodes
        assert (cell.cpu_dram_gb > 0) == (cell.offload == "on")
        assert isinstance(json.loads(data["engine_env"]), dict)
        shlex.split(cell.engine_args)
        assert cell.engine in ("vllm", "sglang", "sim")
        assert cell.speed == 1.0 or cell.engine == "sim"
        # The runner's facts travel in the cell: nothing after the matrix looks the runner up again.
        spec = runners[cell.runner]
        assert (cell.node.hardware, cell.node.gres_type) == (spec.hardware or "", spec.gres_type or "")
        assert cell.node.gpus_per_node == spec.gpus_per_node
        assert (cell.node.intra_node_gbs, cell.node.inter_node_gbs) == (
            spec.intra_node_gbs,
            spec.inter_node_gbs,
        )


def test_issue_entries_are_shipped() -> None:
    b200 = expand(load_sweep(None, "dsr1-fp4-b200-vllm"), load_runners())
    assert {(c.tp, c.ep) for c in b200} == {(4, 4), (8, 8)}
    assert {c.engine for c in b200} == {"vllm"} and b200[0].precision == "fp4"
    llama = load_sweep(None, "llama70b-fp8-h200-vllm")
    assert [p.tp for p in llama.search_space] == [2, 4, 8] and llama.runner == "h200"
    assert load_sweep(None, "dsr1-fp4-mi355x-vllm").runner == "mi355x"
    qwen = load_sweep(None, "qwen3.5-fp8-h200-sglang")
    assert (qwen.engine, qwen.runner, qwen.precision) == ("sglang", "h200", "fp8")


def test_demo_is_two_tp_by_three_users_by_three_modes(repo_root: Path) -> None:
    cells = expand(load_sweep(None, "demo"), load_runners())
    assert len(cells) == 18
    assert {c.tp for c in cells} == {1, 2} and {c.users for c in cells} == {2, 4, 8}
    assert {c.offload for c in cells} == {"on", "off", "noprefix"}
    first = cells[0]
    assert (first.engine, first.runner, first.image, first.speed, first.duration) == (
        "sim",
        "local",
        "",
        50.0,
        15,
    )
    assert first.engine_args == ""
    assert (repo_root / first.traces).is_dir()
    mini = expand(load_sweep(None, "demo-mini"), load_runners())
    assert [(c.tp, c.users, c.offload, c.duration) for c in mini] == [
        (1, 2, "on", 8), (1, 2, "off", 8), (1, 2, "noprefix", 8),
    ]  # fmt: skip


def test_cell_is_frozen() -> None:
    cell = expand(load_sweep(None, "demo-mini"), load_runners())[0]
    with pytest.raises(ValidationError, match="frozen"):
        cell.tp = 4  # type: ignore[misc]
    assert Cell.parse(cell.to_json()) == cell
