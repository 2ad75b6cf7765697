"""Engine recipes: the exact command lines per engine x hardware x offload mode."""

from __future__ import annotations

import pytest
from agentsweep.cell.clients.replay import REPLAY_PLOT_VAR, replay_command
from agentsweep.cell.engines import build_engine_launch
from agentsweep.cell.engines.vllm import VLLM_API_SERVER_PYTHON_VAR
from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError

BASE = Cell(
    exp_name="k-tp4-ep1-u8-on",
    engine="vllm",
    model="org/Model",
    tp=4,
    users=8,
    offload="on",
    duration=600,
    traces="traces/",
    cpu_dram_gb=768.0,
)

VLLM = ["vllm", "serve", "org/Model", "--host", "127.0.0.1", "--port", "8123", "--tensor-parallel-size", "4"]
VLLM_TAIL = ["--enable-prompt-tokens-details"]
VLLM_ON = ["--kv-offloading-backend", "native", "--kv-offloading-size", "768"]
SGL = [
    "python3",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "org/Model",
    "--host",
    "127.0.0.1",
    "--port",
    "8123",
]
SGL_TAIL = ["--tp-size", "4", "--enable-metrics", "--enable-cache-report"]

CASES = [
    # engine, hardware, offload, connector, expected argv, expected env
    ("vllm", "h200", "on", "native", VLLM + VLLM_TAIL + VLLM_ON, {}),
    ("vllm", "b200", "on", "native", VLLM + VLLM_TAIL + VLLM_ON, {}),
    (
        "vllm",
        "mi355x",
        "on",
        "native",
        [*VLLM, *VLLM_TAIL, *VLLM_ON, "--disable-hybrid-kv-cache-manager"],
        {},
    ),
    ("vllm", "h200", "on", "simple", VLLM + VLLM_TAIL + VLLM_ON, {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"}),
    ("vllm", "b200", "on", "simple", VLLM + VLLM_TAIL + VLLM_ON, {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"}),
    (
        "vllm",
        "mi355x",
        "on",
        "simple",
        [*VLLM, *VLLM_TAIL, *VLLM_ON, "--disable-hybrid-kv-cache-manager"],
        {},
    ),
    ("vllm", "h200", "off", "native", VLLM + VLLM_TAIL, {}),
    ("vllm", "b200", "off", "simple", VLLM + VLLM_TAIL, {}),
    ("vllm", "mi355x", "off", "native", VLLM + VLLM_TAIL, {}),
    ("vllm", "h200", "noprefix", "native", [*VLLM, *VLLM_TAIL, "--no-enable-prefix-caching"], {}),
    ("vllm", "b200", "noprefix", "native", [*VLLM, *VLLM_TAIL, "--no-enable-prefix-caching"], {}),
    ("vllm", "mi355x", "noprefix", "native", [*VLLM, *VLLM_TAIL, "--no-enable-prefix-caching"], {}),
    (
        "sglang",
        "h200",
        "on",
        "native",
        [*SGL, *SGL_TAIL, "--enable-hierarchical-cache", "--hicache-size", "192"],
        {},
    ),
    (
        "sglang",
        "b200",
        "on",
        "native",
        [*SGL, *SGL_TAIL, "--enable-hierarchical-cache", "--hicache-size", "192"],
        {},
    ),
    (
        "sglang",
        "mi355x",
        "on",
        "native",
        [*SGL, *SGL_TAIL, "--enable-hierarchical-cache", "--hicache-size", "192"],
        {},
    ),
    ("sglang", "h200", "off", "native", SGL + SGL_TAIL, {}),
    ("sglang", "b200", "off", "native", SGL + SGL_TAIL, {}),
    ("sglang", "mi355x", "off", "native", SGL + SGL_TAIL, {}),
    ("sglang", "h200", "noprefix", "native", [*SGL, *SGL_TAIL, "--disable-radix-cache"], {}),
    ("sglang", "b200", "noprefix", "native", [*SGL, *SGL_TAIL, "--disable-radix-cache"], {}),
    ("sglang", "mi355x", "noprefix", "native", [*SGL, *SGL_TAIL, "--disable-radix-cache"], {}),
]


@pytest.mark.parametrize(("engine", "hardware", "offload", "connector", "argv", "env"), CASES)
def test_recipe_exact_command(engine, hardware, offload, connector, argv, env):
    cell = BASE.replace(
        engine=engine,
        offload=offload,
        offload_connector=connector,
        cpu_dram_gb=768.0 if offload == "on" else 0,
    )
    launch = build_engine_launch(cell, hardware=hardware, port=8123)
    assert launch.argv == argv
    assert launch.env == env
    assert launch.health_path == "/health"


def test_expert_parallel_and_extra_args_come_last():
    cell = BASE.replace(
        ep=4,
        offload="off",
        engine_args="--max-num-seqs 256 --kv-cache-dtype 'fp8'",
        engine_env='{"A": "1"}',
    )
    vllm = build_engine_launch(cell, hardware="b200", port=1)
    assert vllm.argv[-6:] == [
        "--enable-expert-parallel",
        "--enable-prompt-tokens-details",
        "--max-num-seqs",
        "256",
        "--kv-cache-dtype",
        "fp8",
    ]
    assert vllm.env == {"A": "1"}
    sglang = build_engine_launch(cell.replace(engine="sglang"), hardware="h200", port=1)
    assert sglang.argv[9:13] == ["--tp-size", "4", "--ep-size", "4"]


def test_engine_env_overrides_recipe_env():
    cell = BASE.replace(offload_connector="simple", engine_env='{"VLLM_USE_SIMPLE_KV_OFFLOAD": "true"}')
    assert build_engine_launch(cell, hardware="h200", port=1).env == {"VLLM_USE_SIMPLE_KV_OFFLOAD": "true"}
    # ... but never against the cell's own fields: "0" would run the native connector under "simple".
    with pytest.raises(InputError, match="VLLM_USE_SIMPLE_KV_OFFLOAD=0 turns the simple KV offload"):
        BASE.replace(offload_connector="simple", engine_env='{"VLLM_USE_SIMPLE_KV_OFFLOAD": "0"}')


def test_sim_recipe_mirrors_vllm_meanings():
    cell = BASE.replace(engine="sim", speed=50.0, cpu_dram_gb=12.5)
    on = build_engine_launch(cell, hardware="h200", port=9, python="PY")
    assert on.argv == [
        "PY", "-m", "agentsweep.cli", "engine-sim", "org/Model", "--host", "127.0.0.1", "--port", "9",
        "--tensor-parallel-size", "4", "--hardware", "h200", "--speed", "50", "--kv-offloading-size", "12.5",
    ]  # fmt: skip
    noprefix = build_engine_launch(cell.replace(offload="noprefix"), hardware="mi355x", port=9, python="PY")
    assert noprefix.argv[-5:] == ["--hardware", "mi355x", "--speed", "50", "--no-enable-prefix-caching"]
    # The GPU simulated is the cell's: never a default.
    with pytest.raises(InputError, match="a simulated cell names the GPU it simulates"):
        build_engine_launch(cell, hardware=None, port=9, python="PY")


@pytest.mark.parametrize(
    ("precision", "weights"), [("fp8", "fp8"), ("FP4", "fp4"), ("mxfp4", "fp4"), ("bf16", "bf16")]
)
def test_sim_weights_follow_the_cell_precision(precision, weights):
    cell = BASE.replace(engine="sim", offload="off", precision=precision)
    argv = build_engine_launch(cell, hardware="h200", port=9, python="PY").argv
    assert argv[argv.index("--quantization") + 1] == weights
    unknown = cell.replace(precision="int3")
    assert "--quantization" not in build_engine_launch(unknown, hardware="h200", port=9, python="PY").argv


def test_vllm_api_server_entry_for_cpu_wheels():
    launch = build_engine_launch(
        BASE.replace(offload="off"),
        hardware=None,
        port=5,
        environ={VLLM_API_SERVER_PYTHON_VAR: "/venv/bin/python"},
    )
    assert launch.argv[:5] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.cli.main",  # `vllm serve`, without the wheel's console script
        "serve",
        "org/Model",
    ]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "sim"])
def test_offload_on_without_dram_is_refused(engine):
    cell = BASE.replace(engine=engine, cpu_dram_gb=0.0)
    with pytest.raises(InputError, match="offload on needs cpu_dram_gb > 0"):
        build_engine_launch(cell, hardware="h200", port=1)


def test_sglang_needs_a_whole_gib_per_rank():
    cell = BASE.replace(engine="sglang", cpu_dram_gb=3.0)
    with pytest.raises(InputError, match="no whole GiB per rank"):
        build_engine_launch(cell, hardware="h200", port=1)


def test_unknown_hardware_and_bad_engine_args():
    with pytest.raises(InputError, match="unknown hardware"):
        build_engine_launch(BASE, hardware="a100", port=1)
    # A command line that cannot be split is refused when the cell is made, before any recipe runs.
    with pytest.raises(InputError, match="engine_args: cannot be split like a shell command line"):
        BASE.replace(engine_args="--x 'unclosed")


def test_replay_flags_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REPLAY_PLOT_VAR)  # the suite's own setting (tests/conftest.py): the default here
    cell = BASE.replace(
        engine="sim",
        speed=40.0,
        seed=7,
        warmup_requests=2,
        max_delay=30.0,
        advance_min=0.1,
        advance_max=0.5,
        timing_strategy="original",
        max_context=131072,
        ignore_eos=True,
        traces="hf:org/dataset",
    )
    argv = replay_command(cell, endpoint="http://127.0.0.1:5", output_dir="/r", python="PY")
    assert argv == [
        "PY", "-m", "kv_cache_tester.cli", "replay", "--api-endpoint", "http://127.0.0.1:5", "--model", "org/Model",
        "--hf-dataset", "org/dataset", "--output-dir", "/r", "--max-users", "8",
        "--test-duration", "600", "--recycle", "--api", "chat", "--time-scale", "0.025", "--no-color",
        "--seed", "7", "--warmup-requests-per-user", "2", "--timing-strategy", "original", "--max-delay", "30",
        "--advance-min", "0.1", "--advance-max", "0.5", "--max-context", "131072", "--grace-period", "5",
        "--ignore-eos",
    ]  # fmt: skip


def test_replay_tokenizer_for_both_apis():
    chat = replay_command(BASE, endpoint="http://h:1", output_dir="/r", python="PY", tokenizer="org/Model")
    assert chat[-2:] == ["--tokenizer", "org/Model"]
    assert "--grace-period" not in chat  # a real engine keeps the replayer's own grace period
    assert "--busy-poll" in chat  # a GPU node spares a core for exact token arrival times
    assert "--trace-directory" in chat
    comp = replay_command(
        BASE.replace(api="completions"),
        endpoint="http://h:1",
        output_dir="/r",
        tokenizer="org/Model",
    )
    assert comp[-2:] == ["--tokenizer", "org/Model"]  # completions: ids from the model's vocabulary
    assert comp[comp.index("--api") + 1] == "completions"
