"""Hardware is a true cell fact for every simulator profile: the runner states it (or is named after
it), every profile is a valid value, a simulated cell without one is refused, never defaulted."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from agentsweep.cell.engines import build_engine_launch
from agentsweep.config import expand, load_runners, load_sweep
from agentsweep.contract.cell import HARDWARE, Cell
from agentsweep.contract.hardware import AMD_HARDWARE, hardware_label, is_amd
from agentsweep.engine_sim import cli as sim_cli
from agentsweep.engine_sim.profiles import HARDWARE as PROFILES
from agentsweep.errors import InputError
from agentsweep.preflight.node import GPU_NAMES

# The case: a runner named b300 on this machine's launcher, added through $AGENTSWEEP_RUNNERS.
B300_RUNNER = (
    "b300:\n  runs_on: [x]\n  launcher: runners/launch_local.sh\n  gpus_per_node: 8\n"
    "  cpu_dram_gb: 64\n  container_runtime: none\n"
)
ENTRY = """\
k:
  runner: {runner}
  engine: sim
  model: meta-llama/Llama-3.3-70B-Instruct
  precision: fp8
  duration: 10
  traces: t
  speed: 50
  engine_args: [{args}]
  search_space:
    tp1: {{users: [1], offload: [off]}}
"""


def _matrix(cli, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, runners: str, runner: str, args: str = ""):
    (in_tmp / "runners.yaml").write_text(runners)
    (in_tmp / "c.yaml").write_text(ENTRY.format(runner=runner, args=args))
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", "runners.yaml")
    return cli("--config", "c.yaml", "--key", "k", "--json")


def test_every_simulator_profile_is_a_hardware_a_cell_can_name() -> None:
    assert set(HARDWARE) == set(PROFILES)
    assert set(HARDWARE) >= {"h200", "b200", "b300", "gb200", "gb300", "mi325x", "mi355x"}
    assert {name for name in HARDWARE if name.startswith("mi")} == AMD_HARDWARE
    assert is_amd("mi325x") and is_amd("mi355x") and not is_amd("gb300") and not is_amd("")
    assert set(GPU_NAMES) == set(HARDWARE)  # preflight knows each one's product name


def test_a_runner_named_b300_gives_cells_that_run_the_b300_profile(cli, in_tmp, monkeypatch) -> None:
    result = _matrix(cli, in_tmp, monkeypatch, B300_RUNNER, "b300")
    assert result.rc == 0, result.err
    (raw,) = json.loads(result.out)["include"]
    cell = Cell.parse(raw)
    assert (cell.node.hardware, cell.simulated, cell.hardware_label) == ("b300", True, "simulated B300")
    argv = build_engine_launch(cell, hardware=cell.node.hardware, port=1, python="PY").argv
    assert argv[argv.index("--hardware") + 1] == "b300"


def test_hardware_b300_in_engine_args_agrees_with_a_b300_runner(cli, in_tmp, monkeypatch) -> None:
    result = _matrix(cli, in_tmp, monkeypatch, B300_RUNNER, "b300", args="--hardware, b300")
    assert result.rc == 0, result.err
    (raw,) = json.loads(result.out)["include"]
    assert raw["node"]["hardware"] == "b300" and raw["engine_args"] == "--hardware b300"
    # ... and one that contradicts the runner is refused, naming both.
    result = _matrix(cli, in_tmp, monkeypatch, B300_RUNNER, "b300", args="--hardware, h200")
    assert result.rc == 2 and result.err.count("\n") == 1, result.err
    assert "--hardware h200" in result.err and "hardware b300 (its runner's)" in result.err


def test_a_simulated_entry_on_a_runner_stating_no_hardware_is_refused_in_one_line(
    cli, in_tmp, monkeypatch
) -> None:
    runners = B300_RUNNER.replace("b300:", "mybox:")
    result = _matrix(cli, in_tmp, monkeypatch, runners, "mybox")
    assert (result.rc, result.out) == (2, "")
    assert result.err == (
        "config error: c.yaml:k.runner: runner 'mybox' states no hardware, and a simulated cell runs the "
        "profile of the GPU it names; add hardware: <h200|b200|b300|gb200|gb300|mi325x|mi355x> to its "
        "entry in runners.yaml\n"
    )
    # Stating it is all it takes, on a runner of any name.
    result = _matrix(cli, in_tmp, monkeypatch, runners + "  hardware: gb300\n", "mybox")
    assert result.rc == 0, result.err
    assert json.loads(result.out)["include"][0]["node"]["hardware"] == "gb300"


def test_a_hand_made_simulated_cell_without_hardware_is_refused_not_run_as_h200() -> None:
    cell = Cell.parse(
        {"exp_name": "x", "runner": "mybox", "engine": "sim", "model": "m", "tp": 1, "users": 1,
         "offload": "off", "duration": 5, "traces": "t"}
    )  # fmt: skip
    assert cell.node.hardware == "" and cell.hardware_label == "simulated, hardware not stated"
    with pytest.raises(InputError, match=r"cell x: hardware: a simulated cell names the GPU it simulates"):
        build_engine_launch(cell, hardware=None, port=1, python="PY")
    # --hardware in its engine_args cannot stand in for the cell's hardware.
    with pytest.raises(InputError, match=r"no hardware \(its runner states none"):
        cell.replace(engine_args="--hardware b300")
    # A hand-made cell whose runner is named after a GPU stands for it.
    named = cell.replace(runner="gb300", hardware="gb300")
    assert (
        Cell.parse({k: v for k, v in cell.flat().items() if k != "hardware"} | {"runner": "gb300"}) == named
    )


def test_the_local_runner_states_h200_so_the_demo_runs_what_it_ran(repo_root: Path) -> None:
    runners = load_runners(repo_root / "configs" / "runners.yaml")
    assert runners["local"].hardware == "h200"
    for cell in expand(load_sweep(None, "demo"), runners):
        assert (cell.node.hardware, cell.hardware_label) == ("h200", "simulated H200")
        argv = build_engine_launch(cell, hardware=cell.node.hardware, port=1, python="PY").argv
        assert argv[argv.index("--hardware") + 1] == "h200"


@pytest.mark.parametrize("hardware", sorted(PROFILES))
def test_a_shipped_key_targets_each_simulated_gpu(hardware: str, repo_root: Path) -> None:
    runners = load_runners(repo_root / "configs" / "runners.yaml")
    runner = runners[f"sim-{hardware}"]
    assert (runner.hardware, runner.launcher) == (hardware, "runners/launch_local.sh")
    cells = expand(load_sweep(None, f"sim-{hardware}"), runners)
    assert cells and {c.hardware_label for c in cells} == {f"simulated {hardware.upper()}"}
    for cell in cells:
        argv = build_engine_launch(cell, hardware=cell.node.hardware, port=1, python="PY").argv
        assert argv[argv.index("--hardware") + 1] == hardware
        # The model fits each GPU at every TP of the grid: the engine would start.
        args = argparse.ArgumentParser()
        sim_cli.add_arguments(args)
        setup = sim_cli.resolve(args.parse_args(argv[argv.index("engine-sim") + 1 :]))
        assert setup.gpu_blocks > 0 and setup.hardware == hardware


def test_hardware_label_names_the_gpu_and_whether_it_was_simulated() -> None:
    assert hardware_label(True, "b300") == "simulated B300"
    assert hardware_label(False, "mi355x") == "MI355X"
    assert hardware_label(False, "", "site-a") == "runner site-a"
    assert hardware_label(True, "", "local") == "simulated, hardware not stated"


def test_engine_sim_start_up_line_names_the_simulated_gpu_and_a_default() -> None:
    def first_line(argv: list[str]) -> str:
        parser = argparse.ArgumentParser()
        sim_cli.add_arguments(parser)
        args = parser.parse_args(argv)
        return sim_cli.startup_lines(args, sim_cli.resolve(args))[0]

    model = "meta-llama/Llama-3.3-70B-Instruct"
    line = first_line([model, "--hardware", "b300", "--quantization", "fp8"])
    assert line.startswith("[engine_sim] simulated B300, vllm engine: ") and " hardware=b300 " in line
    line = first_line([model, "--quantization", "fp8"])
    assert line.startswith("[engine_sim] simulated H200 (the default: --hardware not given), vllm engine")


def test_preflight_tells_b200_from_gb200() -> None:
    from agentsweep.preflight.node import NodeSpec, check_gpus

    listing = "\n".join(f"GPU {i}: NVIDIA GB200 (UUID: GPU-{i})" for i in range(4))

    def run(argv):
        return 0, listing

    def spec(hardware: str) -> NodeSpec:
        return NodeSpec(runner="r", vendor="nvidia", hardware=hardware, gpus=4, mem_gb=0)

    assert check_gpus(spec("gb200"), "n1", run).status == "PASS"
    assert check_gpus(spec("b200"), "n1", run).status == "FAIL"
