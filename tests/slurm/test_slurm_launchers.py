"""The H200/B200/MI355X launchers end to end on a real single-node Slurm (see conftest.py).

The node carries 8 GPUs of each type in gres.conf order, so Slurm numbers them h200 0-7, b200 8-15,
mi355x 16-23: the indices a cell sees prove which typed GRES it got.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support import wait_until

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).resolve().parent / "standin_cell.sh"
TYPE_INDICES = {"h200": range(0, 8), "b200": range(8, 16), "mi355x": range(16, 24)}
SECRET = "hf_not_a_real_token_1234"


def launch(runner: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "runners" / f"launch_{runner}.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def standin_env(slurm, cell_env, make_runners, tmp_path: Path, runner: str, **kw) -> dict[str, str]:  # type: ignore[no-untyped-def]
    runners = make_runners(tmp_path / "runners.yaml", runtime=kw.pop("runtime", "none"))
    env = cell_env(runner, runners, base_env=slurm.env, **kw)
    env["AGENTSWEEP_CELL_SCRIPT"] = str(STANDIN)
    env["HF_TOKEN"] = SECRET
    return env


def job_field(job_info: str, name: str) -> str:
    match = re.search(rf"\b{name}=(\S+)", job_info)
    assert match, f"{name} not in {job_info!r}"
    return match.group(1)


@pytest.mark.parametrize("runner", ["h200", "b200", "mi355x"])
def test_cell_gets_typed_gpus_and_results_land(slurm, cell_env, make_runners, tmp_path, runner):
    env = standin_env(slurm, cell_env, make_runners, tmp_path, runner, tp=2, offload="on")
    proc = launch(runner, env)
    assert proc.returncode == 0, proc.stderr
    result = Path(env["RESULT_DIR"])
    assert (result / "status.txt").read_text().splitlines()[0] == "SUCCESS"
    record = json.loads((result / "cell.json").read_text())
    assert record["cell"]["exp_name"] == json.loads(env["AGENTSWEEP_CELL"])["exp_name"]
    assert record["cwd"] == str(REPO)

    # The GPU list reaches the cell in the variable the vendor's runtime reads, and only there.
    visible = record["visible_devices"]
    name = "ROCR_VISIBLE_DEVICES" if runner == "mi355x" else "CUDA_VISIBLE_DEVICES"
    assert list(visible) == [name]
    indices = [int(i) for i in visible[name].split(",")]
    assert len(indices) == 2 and all(i in TYPE_INDICES[runner] for i in indices)

    # What Slurm was asked for: typed GRES, the runner's partition, a time limit from the duration
    # (4 s + 120 s start-up + 300 s drain -> 8 min), memory for the offload budget (8 GiB + 32).
    info = record["job_info"]
    assert job_field(info, "TresPerNode") == f"gres:gpu:{runner}:2"
    assert job_field(info, "Partition") == runner
    assert job_field(info, "TimeLimit") == "00:08:00"
    assert (
        job_field(info, "MinMemoryNode") == f"{int(json.loads(env['AGENTSWEEP_CELL'])['cpu_dram_gb']) + 32}G"
    )

    # The secret arrives by name; its value is never printed by the launcher.
    assert record["hf_token"] == SECRET
    assert SECRET not in proc.stdout + proc.stderr
    assert "ALL" not in re.findall(r"--export=(\S+)", proc.stderr)
    assert slurm.jobs() == []


@pytest.mark.parametrize("runner", ["h200", "mi355x"])
def test_failing_cell_status_propagates_and_allocation_is_released(
    slurm, cell_env, make_runners, tmp_path, runner
):
    env = standin_env(slurm, cell_env, make_runners, tmp_path, runner, tp=1)
    env["AGENTSWEEP_TEST_EXIT"] = "3"
    proc = launch(runner, env)
    assert proc.returncode == 3, proc.stderr
    assert (Path(env["RESULT_DIR"]) / "status.txt").read_text().startswith("FAILED")
    job_id = re.search(r"Granted job allocation (\d+)", proc.stderr).group(1)  # type: ignore[union-attr]
    assert f"released job {job_id}" in proc.stderr
    assert slurm.jobs() == []


def test_cell_larger_than_node_is_refused_with_slurms_message(slurm, cell_env, make_runners, tmp_path):
    # The runners file claims 16 GPUs per node; the node has 8 b200: Slurm refuses the allocation.
    runners = make_runners(tmp_path / "runners16.yaml", gpus_per_node=16)
    env = cell_env("b200", runners, tp=16, base_env=slurm.env)
    env["AGENTSWEEP_CELL_SCRIPT"] = str(STANDIN)
    proc = launch("b200", env)
    assert proc.returncode == 1
    assert "Requested node configuration is not available" in proc.stderr
    status = (Path(env["RESULT_DIR"]) / "status.txt").read_text().splitlines()
    assert status[0] == "FAILED" and "Requested node configuration is not available" in status[1]
    assert not (Path(env["RESULT_DIR"]) / "cell.json").exists()
    assert slurm.jobs() == []


def test_sigterm_stops_the_step_and_releases_the_job(slurm, cell_env, make_runners, tmp_path):
    env = standin_env(slurm, cell_env, make_runners, tmp_path, "h200", tp=1)
    env["AGENTSWEEP_TEST_SLEEP"] = "60"
    started = tmp_path / "standin-started"
    env["AGENTSWEEP_TEST_STARTED"] = str(started)
    proc = subprocess.Popen(
        ["bash", str(REPO / "runners" / "launch_h200.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        # The step's task itself, not only the step in squeue: a step listed before its task runs
        # loses a signal sent in between (the launcher then ends it only after its stop wait).
        wait_until(started.exists, timeout=30, interval=0.2, what="the cell's step to start its task")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert "released job" in err
    assert slurm.jobs() == []
    assert not (Path(env["RESULT_DIR"]) / "cell.json").exists()


FAKE_DOCKER = r"""#!/usr/bin/env bash
# docker stand-in: logs each call; `run` executes the command on the host under the given name.
set -u
state=${AGENTSWEEP_FAKE_DOCKER_STATE:?}
printf '%s\n' "$*" >>"$state/calls.log"
case $1 in
run)
  shift
  name=""
  while (($#)); do
    case $1 in
    --name) name=$2; shift 2 ;;
    --rm | --device=* | --env=*) shift ;;
    --*) shift 2 ;;
    *) break ;;
    esac
  done
  shift # the image
  "$@" &
  echo $! >"$state/$name.pid"
  wait $!
  ;;
stop | rm | kill)
  for arg in "$@"; do
    [[ -f $state/$arg.pid ]] && kill "$(cat "$state/$arg.pid")" 2>/dev/null
  done
  exit 0
  ;;
esac
"""


def fake_docker(tmp_path: Path, env: dict[str, str]) -> Path:
    bin_dir = tmp_path / "bin"
    state = tmp_path / "docker-state"
    bin_dir.mkdir()
    state.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["AGENTSWEEP_FAKE_DOCKER_STATE"] = str(state)
    return state


def test_mi355x_docker_runtime_runs_a_named_container(slurm, cell_env, make_runners, tmp_path):
    env = standin_env(
        slurm, cell_env, make_runners, tmp_path, "mi355x", tp=2, runtime="docker", image="rocm/vllm:test"
    )
    state = fake_docker(tmp_path, env)
    proc = launch("mi355x", env)
    assert proc.returncode == 0, proc.stderr
    calls = (state / "calls.log").read_text().splitlines()
    # The node's copy is inspected for its digest first (docs/first-run.md), then the engine runs.
    assert all(c.startswith("image inspect ") for c in calls[:-1]), calls
    (call,) = [c for c in calls if c.startswith("run ")]
    job_id = re.search(r"Granted job allocation (\d+)", proc.stderr).group(1)  # type: ignore[union-attr]
    name = f"agentsweep-{json.loads(env['AGENTSWEEP_CELL'])['exp_name']}-{job_id}"
    for part in ("--device /dev/kfd", "--device /dev/dri", "--group-add video", f"--name {name}"):
        assert part in call
    assert "--env HF_TOKEN " in call and SECRET not in call
    assert "--env ROCR_VISIBLE_DEVICES" in call and "--env PATH" not in call
    assert f"--volume {REPO}:{REPO}" in call and f"rocm/vllm:test bash {STANDIN}" in call
    record = json.loads((Path(env["RESULT_DIR"]) / "cell.json").read_text())
    assert list(record["visible_devices"]) == ["ROCR_VISIBLE_DEVICES"]
    assert slurm.jobs() == []


def test_mi355x_interrupt_stops_only_this_cells_container(slurm, cell_env, make_runners, tmp_path):
    env = standin_env(
        slurm, cell_env, make_runners, tmp_path, "mi355x", tp=1, runtime="docker", image="rocm/vllm:test"
    )
    state = fake_docker(tmp_path, env)
    env["AGENTSWEEP_TEST_SLEEP"] = "60"
    proc = subprocess.Popen(
        ["bash", str(REPO / "runners" / "launch_mi355x.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        wait_until(lambda: list(state.glob("*.pid")), timeout=30, interval=0.2, what="the container to start")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=45)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    (pid_file,) = state.glob("*.pid")
    name = pid_file.stem
    calls = (state / "calls.log").read_text().splitlines()
    stops = [c for c in calls if c.split()[0] in ("stop", "rm", "kill")]
    assert stops, err
    assert all(c.split()[-1] == name for c in stops), stops
    assert not any("ps" in c.split()[:1] for c in calls)
    assert slurm.jobs() == []


def engine_sim_available() -> bool:
    probe = subprocess.run(
        [str(REPO / ".venv" / "bin" / "agentsweep"), "engine-sim", "--help"], capture_output=True, timeout=60
    )
    return probe.returncode == 0 and (REPO / "benchmarks" / "run_cell.sh").exists()


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["h200", "b200", "mi355x"])
def test_real_cell_script_with_simulated_engine(slurm, cell_env, make_runners, tmp_path, runner):
    if not engine_sim_available():
        pytest.skip("benchmarks/run_cell.sh or `agentsweep engine-sim` not available")
    runners = make_runners(tmp_path / "runners.yaml")
    env = cell_env(runner, runners, tp=2, users=2, offload="on", duration=3, base_env=slurm.env)
    proc = launch(runner, env, timeout=120)
    result = Path(env["RESULT_DIR"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (result / "status.txt").read_text().splitlines()[0] == "SUCCESS"
    record = json.loads((result / "cell.json").read_text())
    assert record["status"] == "SUCCESS"
    assert record["cell"]["exp_name"] == json.loads(env["AGENTSWEEP_CELL"])["exp_name"]
    name = "ROCR_VISIBLE_DEVICES" if runner == "mi355x" else "CUDA_VISIBLE_DEVICES"
    indices = [int(i) for i in record["visible_devices"][name].split(",")]
    assert len(indices) == 2 and all(i in TYPE_INDICES[runner] for i in indices)
    summary = json.loads((result / "summary.json").read_text())
    assert summary["counts"]["ok"] > 0
    assert (result / "server_metrics.csv").stat().st_size > 0
    assert slurm.jobs() == []
