"""A cell's label is true: engine_args and engine_env never contradict its fields (TP, EP, prefix caching,
offload, hardware, speed, model, served name, ports), at the matrix and for a hand-made cell; arguments
that only add settings stay free."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.contract.cell import Cell
from agentsweep.contract.engine_args import (
    SWITCH,
    engine_args_conflict,
    given_flags,
    guarded_spellings,
)
from agentsweep.engine_sim.cli import add_arguments as sim_arguments
from agentsweep.errors import InputError

IMAGE = {"vllm": "vllm/vllm-openai:v0.33.0", "sglang": "lmsysorg/sglang:v0.5.23", "sim": ""}


def _config(tmp_path: Path, engine: str, *, args: str = "", env: dict[str, str] | None = None,
            point: str = "tp2: {users: [1], offload: [off]}", runner: str = "local") -> Path:  # fmt: skip
    path = tmp_path / "c.yaml"
    lines = [
        "k:",
        f"  runner: {runner}",
        f"  engine: {engine}",
        "  model: org/Model",
        "  precision: fp8",
        "  duration: 60",
        "  traces: t",
        *([f"  image: {IMAGE[engine]}"] if IMAGE[engine] else []),
        *([f"  engine_args: {json.dumps(args)}"] if args else []),
        *([f"  engine_env: {json.dumps(env)}"] if env else []),
        "  search_space:",
        f"    {point}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _matrix(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["matrix", "--config", str(config), "--key", "k", "--json"])
    return code, capsys.readouterr().err.strip().splitlines()


# (engine, engine_args, what the line must say of the engine side, of the cell side)
CONTRADICTIONS = [
    ("sim", "--tensor-parallel-size 8", "tensor parallelism to 8", "tp 2"),
    ("sim", "--tp=4", "tensor parallelism to 4", "tp 2"),
    ("sim", "-tp8", "tensor parallelism to 8", "tp 2"),
    ("sim", "--tensor_parallel 4", "tensor parallelism to 4", "tp 2"),  # underscores, abbreviated
    ("sim", "--speed 10", "speed to 10", "speed 1"),
    ("sim", "--spe 10", "speed to 10", "speed 1"),
    ("sim", "--hardware b200", "hardware profile to b200", "hardware h200 (its runner's)"),
    ("sim", "--no-enable-prefix-caching", "prefix caching to off", "offload off (prefix caching on)"),
    ("sim", "--disable-radix-cache", "prefix caching to off", "offload off (prefix caching on)"),
    ("sim", "--ep-size 2", "expert parallelism to 2", "ep 1"),
    ("sim", "--enable-expert-parallel", "expert parallelism to 2", "ep 1"),
    ("sim", "--kv-offloading-size 100", "sets the KV offload", "offload off (no KV offload)"),
    ("sim", "--model other/Model", "the model to other/Model", "model 'org/Model'"),
    ("sim", "--served-model-name alias", "served model name to alias", "model 'org/Model'"),
    ("sim", "--port 9000", "the port or host", "ports and host"),
    ("sim", "--host=0.0.0.0", "the port or host", "ports and host"),
    ("sim", "--disaggregation-mode prefill", "prefill/decode role", "prefill/decode split"),
    ("vllm", "--tensor-parallel-size 8", "tensor parallelism to 8", "tp 2"),
    ("vllm", "-tp 8", "tensor parallelism to 8", "tp 2"),
    ("vllm", "--tensor_parallel_size=8", "tensor parallelism to 8", "tp 2"),
    ("vllm", "--pipeline-parallel-size 2", "pipeline parallelism to 2", "tp 2"),
    ("vllm", "--data-parallel-size 2", "data parallelism to 2", "tp 2"),
    ("vllm", "--enable-expert-parallel", "expert parallelism to on", "ep 1"),
    ("vllm", "--no-enable-prefix-caching", "prefix caching to off", "offload off (prefix caching on)"),
    ("vllm", "--kv-offloading-size 64", "sets the KV offload", "offload off"),
    (
        "vllm",
        '--kv-transfer-config \'{"kv_connector":"LMCacheConnectorV1"}\'',
        "the KV offload",
        "offload off",
    ),
    ("vllm", "--kv-transfer-config.kv_connector X", "the KV offload", "offload off"),
    ("vllm", "--served-model-name other", "served model name to other", "model 'org/Model'"),
    ("vllm", "--port 8000", "the port or host", "ports and host"),
    ("sglang", "--tp 8", "tensor parallelism to 8", "tp 2"),
    ("sglang", "--tp-size=4", "tensor parallelism to 4", "tp 2"),
    ("sglang", "--dp-size 2", "data parallelism to 2", "tp 2"),
    ("sglang", "--ep-size 2", "expert parallelism to 2", "ep 1"),
    ("sglang", "--disable-radix-cache", "prefix caching to off", "offload off (prefix caching on)"),
    ("sglang", "--enable-hierarchical-cache", "hierarchical (CPU) cache to on", "offload off"),
    ("sglang", "--hicache-size 100", "the KV offload", "offload off"),
    ("sglang", "--model-path other/Model", "the model to other/Model", "model 'org/Model'"),
    ("sglang", "--port 30000", "the port or host", "ports and host"),
]


@pytest.mark.parametrize(("engine", "args", "engine_side", "cell_side"), CONTRADICTIONS)
def test_contradicting_engine_args_are_refused_at_the_matrix_in_one_line(
    tmp_path, capsys, engine, args, engine_side, cell_side
):
    code, err = _matrix(_config(tmp_path, engine, args=args), capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"config error: {tmp_path / 'c.yaml'}:k: engine_args ")
    assert engine_side in err[0] and cell_side in err[0], err[0]
    assert "search_space.tp2, cell k-tp2-ep1-u1-off" in err[0]


@pytest.mark.parametrize(("engine", "args", "engine_side", "cell_side"), CONTRADICTIONS)
def test_contradicting_engine_args_are_refused_in_a_hand_made_cell(engine, args, engine_side, cell_side):
    cell = {"exp_name": "x", "engine": engine, "model": "org/Model", "tp": 2, "users": 1, "offload": "off"}
    cell |= {"duration": 60, "traces": "t", "engine_args": args, "hardware": "h200"}
    with pytest.raises(InputError) as err:
        Cell.parse(cell, where="--cell")
    line = str(err.value)
    assert line.startswith("--cell: engine_args ") and "\n" not in line
    assert engine_side in line and cell_side in line


AGREEING = [
    ("sim", "--tensor-parallel-size 2 --speed 1 --hardware h200", "off"),
    ("sim", "--enable-prefix-caching --served-model-name org/Model alias", "off"),
    ("sim", "--no-enable-prefix-caching", "noprefix"),
    ("sim", "--num-gpu-blocks-override 4096 --max-num-seqs 64 --kv-cache-dtype fp8 --seed 3", "off"),
    ("vllm", "--max-model-len 131072 --kv-cache-dtype fp8 --trust-remote-code -tp 2", "off"),
    ("vllm", "--no-enable-expert-parallel --moe-backend flashinfer_cutlass", "on"),
    ("vllm", "--no-enable-prefix-caching", "noprefix"),
    ("sglang", "--context-length 131072 --tp 2 --ep 1 --mem-fraction-static 0.8", "off"),
    ("sglang", "--disable-radix-cache --served-model-name org/Model", "noprefix"),
    ("sglang", "--enable-hierarchical-cache --disaggregation-transfer-backend nixl", "on"),
]


@pytest.mark.parametrize(("engine", "args", "offload"), AGREEING)
def test_arguments_that_add_settings_or_repeat_the_cell_stay_free(tmp_path, capsys, engine, args, offload):
    point = f"tp2: {{users: [1], offload: [{offload}]}}"
    runner = "h200" if offload == "on" else "local"
    code, err = _matrix(_config(tmp_path, engine, args=args, point=point, runner=runner), capsys)
    assert code == 0, err


@pytest.mark.parametrize(
    ("engine", "env", "says"),
    [
        ("vllm", {"CUDA_VISIBLE_DEVICES": "0,1"}, "engine_env CUDA_VISIBLE_DEVICES sets the GPUs it sees"),
        ("sim", {"HIP_VISIBLE_DEVICES": "0"}, "engine_env HIP_VISIBLE_DEVICES sets the GPUs it sees"),
        ("vllm", {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"}, "turns the simple KV offload connector on"),
        ("vllm", {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}, "sets the NIXL handshake address"),
    ],
)
def test_contradicting_engine_env_is_refused(tmp_path, capsys, engine, env, says):
    code, err = _matrix(_config(tmp_path, engine, env=env), capsys)
    assert code == 2 and len(err) == 1 and says in err[0], err


def test_engine_env_that_only_adds_stays_free(tmp_path, capsys):
    env = {"VLLM_ROCM_USE_AITER": "1", "VLLM_USE_SIMPLE_KV_OFFLOAD": "0", "NCCL_DEBUG": "WARN"}
    assert _matrix(_config(tmp_path, "vllm", env=env), capsys)[0] == 0


def test_a_tp_flag_contradicts_one_role_of_a_disaggregated_cell(tmp_path, capsys):
    point = "- {prefill: {tp: 2}, decode: {tp: 1}, users: [1], offload: [off], router: [round_robin]}"
    config = _config(tmp_path, "sim", args="--tp 1", point="")
    config.write_text(config.read_text().replace("    \n", f"    {point}\n"))
    code, err = _matrix(config, capsys)
    assert code == 2 and "tp of its instances (1, 2)" in err[0], err


def test_a_refused_secret_never_reaches_the_error_line(tmp_path, capsys):
    token = "hf_" + "Zz9" * 12
    code, err = _matrix(_config(tmp_path, "sim", args=f"--served-model-name {token}"), capsys)
    assert code == 2 and token not in "\n".join(err) and "***" in err[0]


def _sim_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    sim_arguments(parser)
    return parser


@pytest.mark.parametrize("spelling", guarded_spellings("sim"))
def test_every_guarded_sim_flag_is_one_the_simulated_engine_parses(spelling):
    """The table names real flags: the simulated engine's own parser takes each spelling and sets a
    value that differs from its default."""
    parser = _sim_parser()
    kind = next(g.flag.kind for g in given_flags("sim", f"{spelling} 3") if g.flag.spelling == spelling)
    value = {"--hardware": "b200", "--disaggregation-mode": "prefill", "--model": "x", "--model-path": "x"}
    words = [spelling] if kind == SWITCH else [spelling, value.get(spelling, "3")]
    # (a switch that sets the default is read after its opposite)
    base = ["org/Model", *(["--no-enable-prefix-caching"] if spelling == "--enable-prefix-caching" else [])]
    default = vars(parser.parse_args(base))
    parsed = vars(parser.parse_args([*base, *words]))
    assert parsed != default, spelling


def test_the_shipped_config_holds_no_contradiction():
    from agentsweep.config import load_runners, select_cells
    from agentsweep.config.loader import read_config_file

    config = Path(__file__).resolve().parents[2] / "configs" / "agentic.yaml"
    runners = load_runners()
    for key in read_config_file(config).entries:
        for cell in select_cells(config, [key], runners=runners, max_cells=None):
            assert engine_args_conflict(cell) is None, cell.exp_name
