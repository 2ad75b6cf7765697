"""The settings an engine states at start-up, read from its log and held against the cell's label."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
from agentsweep.cell.effective import Stated, expected_settings, mismatches, stated_settings
from agentsweep.cell.lifecycle import run_cell
from agentsweep.cell.plan import CellOptions, plan_cell
from agentsweep.cell.port_allocation import FreePortAllocator
from agentsweep.contract.cell import Cell

# The start-up lines as vLLM 0.11-0.19 and SGLang 0.5 write them (shortened where they run on).
VLLM_LOG = """\
(APIServer pid=13) INFO 11-28 23:05:33 [utils.py:243] non-default args: {'model_tag': 'org/Model', \
'host': '127.0.0.1', 'port': 8123, 'model': 'org/Model', 'tensor_parallel_size': 8, \
'enable_prefix_caching': False, 'enable_expert_parallel': True, 'kv_offloading_size': 64.0, \
'kv_offloading_backend': 'native', 'compilation_config': CompilationConfig(level=None)}
(APIServer pid=13) INFO 11-28 23:05:41 [model.py:1745] Using max model len 32768
(EngineCore_DP0 pid=178) INFO 11-28 23:05:46 [core.py:97] Initializing a V1 LLM engine (v0.11.1) with \
config: model='org/Model', speculative_config=None, tokenizer='org/Model', skip_tokenizer_init=False, \
dtype=torch.bfloat16, max_seq_len=32768, download_dir=None, load_format=auto, tensor_parallel_size=8, \
pipeline_parallel_size=1, data_parallel_size=1, disable_custom_all_reduce=True, quantization=None, \
served_model_name=org/Model, enable_prefix_caching=False, chunked_prefill_enabled=True, \
compilation_config={'level': None, 'cudagraph_capture_sizes': [512, 504, 1]}
"""
SGLANG_LOG = """\
[2026-02-18 03:19:27] INFO server_args.py:1830: Attention backend not specified. Use fa3 backend by default.
[2026-02-18 03:19:27] server_args=ServerArgs(model_path='org/Model', tokenizer_path='org/Model', \
tokenizer_mode='auto', host='127.0.0.1', port=30000, dtype='auto', quantization=None, \
mem_fraction_static=0.835, served_model_name='org/Model', tp_size=4, pp_size=1, dp_size=1, ep_size=4, \
disable_radix_cache=True, enable_hierarchical_cache=False, hicache_ratio=2.0, hicache_size=0, \
disaggregation_mode='null')
"""


def _cell(**over: object) -> Cell:
    base = {"exp_name": "x", "engine": "vllm", "model": "org/Model", "tp": 8, "users": 1, "offload": "on"}
    base |= {"duration": 60, "traces": "t", "cpu_dram_gb": 64.0, "image": "i"}
    return Cell.parse({**base, **over})


def test_vllm_states_its_settings_in_two_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(VLLM_LOG)
    stated = stated_settings("vllm", log)
    assert stated is not None and stated.source == "server.log: non-default args and engine config"
    assert stated.settings == {
        "model": "org/Model", "served_model_name": "org/Model", "tp": 8, "pp": 1, "dp": 1,
        "expert_parallel": True, "kv_offload": True, "port": 8123, "prefix_caching": False,
    }  # fmt: skip
    # An `on` cell (prefix caching on) that the engine ran without prefix caching: named, with the line.
    got = mismatches(expected_settings(_cell(ep=8), 8, 8123), stated, "engine")
    assert got == [
        "engine runs with prefix_caching off but the cell says on (server.log: non-default args and engine config)"
    ]


def test_sglang_states_its_settings_in_server_args(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(SGLANG_LOG)
    stated = stated_settings("sglang", log)
    assert stated is not None
    assert stated.settings == {
        "model": "org/Model", "served_model_name": "org/Model", "port": 30000, "tp": 4, "pp": 1, "dp": 1,
        "ep": 4, "prefix_caching": False, "kv_offload": False,
    }  # fmt: skip
    cell = _cell(engine="sglang", tp=4, ep=4, offload="noprefix", cpu_dram_gb=0.0)
    assert mismatches(expected_settings(cell, 4, 30000), stated, "engine") == []
    assert mismatches(expected_settings(cell.replace(ep=1), 4, 30000), stated, "engine") == [
        "engine runs with ep 4 but the cell says 1 (server.log: server_args)"
    ]


def test_a_log_that_states_nothing_is_not_judged(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO starting\n" + "x" * 5000 + "\n")
    assert stated_settings("vllm", log) is None and stated_settings("sim", log) is None
    assert stated_settings("sglang", tmp_path / "absent.log") is None


def test_hostile_values_in_a_log_stay_short_plain_json(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "non-default args: {'model_tag': b'\\xff', 'tensor_parallel_size': {1, 2}, 'port': 'x' * 9}\n"
    )
    stated = stated_settings("vllm", log)
    assert stated is not None
    json.dumps(stated.to_record())  # serialisable whatever the log held


def _sim_cell(repo_root: Path, **over: object) -> Cell:
    cell = {
        "config_key": "eff", "exp_name": "eff-tp1-ep1-u2-off", "runner": "local", "engine": "sim", "hardware": "h200",
        "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "tp": 1, "users": 2, "offload": "off",
        "duration": 4, "traces": str(repo_root / "kv-cache-tester" / "sample_traces"), "max_context": 65536,
        "max_delay": 1, "min_window_coverage": 0.5, "max_dispatch_lag_p99_s": 2.0, "warmup_requests": 0,
        "speed": 50, "engine_args": "--num-gpu-blocks-override 4096", "max_throughput_drift": 5.0,
    }  # fmt: skip
    return Cell.parse({**cell, **over})


def _run(plan) -> tuple[str, list[str], dict]:
    os.environ.pop("PORT", None)
    status, _ = run_cell(plan, CellOptions(health_timeout_s=30), log=lambda _line: None)
    lines = (plan.result_dir / "status.txt").read_text().splitlines()
    assert lines[0] == status
    return status, lines[1:], json.loads((plan.result_dir / "cell.json").read_text())


@pytest.mark.slow
def test_a_simulated_cell_records_what_its_engine_ran_with(repo_root, tmp_path):
    plan = plan_cell(_sim_cell(repo_root), tmp_path / "ok", ports=FreePortAllocator(), python=sys.executable)
    status, reasons, record = _run(plan)
    assert status == "SUCCESS", reasons
    stated = record["engine_settings"]["engine"]
    assert stated["source"] == "server.log: effective settings"
    assert stated["settings"]["speed"] == 50 and stated["settings"]["tp"] == 1
    assert stated["settings"]["model"] == "meta-llama/Llama-3.3-70B-Instruct"
    summary = json.loads((plan.result_dir / "summary.json").read_text())
    assert summary["validity"]["checks"]["engine_settings"]["ok"] is True


@pytest.mark.slow
def test_an_engine_running_other_settings_than_its_label_is_invalid(repo_root, tmp_path):
    """The engine's command line is changed behind the cell's back (a recipe bug, a config file the
    engine reads): what the engine states at start-up makes the cell INVALID, naming both."""
    plan = plan_cell(_sim_cell(repo_root), tmp_path / "lie", ports=FreePortAllocator(), python=sys.executable)
    engine = plan.instances[0]
    argv = [*engine.engine.argv, "--speed", "5", "--no-enable-prefix-caching"]
    lying = dataclasses.replace(engine, engine=dataclasses.replace(engine.engine, argv=argv))
    status, reasons, record = _run(dataclasses.replace(plan, instances=[lying]))
    assert status == "INVALID"
    (line,) = [r for r in reasons if r.startswith("engine_settings: ")]
    assert "engine runs with prefix_caching off but the cell says on (server.log: effective settings)" in line
    assert "engine runs with speed 5 but the cell says 50" in line
    assert record["engine_settings"]["engine"]["settings"]["speed"] == 5


def test_the_stated_record_round_trips_through_cell_json(tmp_path):
    from agentsweep.cell.record import write_result
    from agentsweep.contract.resultdir import read_cell_record

    stated = Stated({"tp": 2, "model": "m"}, "server.log: effective settings")
    write_result(
        tmp_path, cell=_cell().to_dict(), engine_command=[], engine_env={}, replay_command=[], versions={},
        start_utc="2026-01-01T00:00:00Z", status="INVALID", reasons=["engine_settings: x"],
        extra={"engine_settings": {"engine": stated.to_record(), "r1": None}},
    )  # fmt: skip
    record = read_cell_record(tmp_path)
    assert record is not None and record.engine_settings == {"engine": stated.to_record(), "r1": None}
