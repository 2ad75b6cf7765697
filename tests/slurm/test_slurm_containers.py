"""Routed cells under a container runtime: the cell on the host side of its node, its engines in the image.

A routed (or multi-node) cell whose runner uses pyxis or docker runs its router, scrapers and replayer
with the runner's interpreter on the node's host, and each engine instance as a step of its own in the
container (agentsweep.cell.placement). The docker path runs for real here, on the one-node test Slurm,
with podman as `docker` and an image built on this machine from its own packages
(tests/slurm/container_image.py); pyxis cannot be installed here (a SPANK plugin over enroot, neither
packaged by Debian), so its path is checked through the launcher's dry run and the cell's plan.

Without a working podman the container test skips with one line naming why;
AGENTSWEEP_REQUIRE_CONTAINERS=1 turns that into a failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agentsweep.cell.placement import CELL_ON_HOST_VAR, CONTAINER_ARGS_VAR, HOST_ONLY_NAMES, from_environ
from agentsweep.cell.plan import plan_cell
from agentsweep.cell.port_allocation import DryRunPortAllocator
from agentsweep.config import load_runners, select_cells
from agentsweep.contract.cell import CELL_ENV_VAR, Cell

from tests.slurm import container_image
from tests.support import poll_until

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"

SWEEP = """\
ct:
  runner: {runner}
  engine: {engine}
  model: meta-llama/Llama-3.3-70B-Instruct
  precision: fp8
  image: "{image}"
  duration: {duration}
  speed: {speed}
  traces: kv-cache-tester/sample_traces
  replay: {{max_context: 65536, warmup_requests: 0, max_delay: 1}}
  engine_args: "{engine_args}"
  router_program: smg
  # What these tests check is where the processes run, not each run's steadiness: room for a machine
  # busy with the rest of the suite (two cores, the engines' containers starting beside other cells).
  validity: {{max_throughput_drift: 5.0, max_dispatch_lag_p99_s: 2.0, min_window_coverage: 0.5, max_lane_idle_s: 60.0}}
  search_space:
    tp1: {{users: 4, offload: [off], replicas: {replicas}{router}}}
"""


def make_cell(
    make_runners: Callable[..., Path],
    tmp_path: Path,
    runner: str,
    runtime: str,
    image: str,
    *,
    engine: str = "sim",
    replicas: int = 2,
    duration: int = 6,
) -> tuple[Cell, Path]:
    runners = make_runners(tmp_path / "runners.yaml", runtime=runtime)
    sweep = tmp_path / "sweep.yaml"
    sim = engine == "sim"
    sweep.write_text(
        SWEEP.format(
            runner=runner, engine=engine, image=image, duration=duration, speed=50 if sim else 1,
            engine_args=f"--hardware {runner} --num-gpu-blocks-override 4096" if sim else "",
            replicas=replicas, router=", router: [round_robin]" if replicas > 1 else "",
        )
    )  # fmt: skip
    (cell,) = select_cells(sweep, ["ct"], runners=load_runners(runners))
    return cell, runners


def launcher_env(cell: Cell, runners: Path, result: Path, base: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in (CELL_ENV_VAR, "PORT")}
    env.update({CELL_ENV_VAR: cell.to_json(), "AGENTSWEEP_RUNNERS": str(runners), "RESULT_DIR": str(result)})
    return env


def dry_run(runner: str, env: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        ["bash", str(REPO / "runners" / f"launch_{runner}.sh")],
        env={**env, "AGENTSWEEP_DRY_RUN": "1"}, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def srun_lines(lines: list[str]) -> list[list[str]]:
    return [shlex.split(line) for line in lines if line.startswith("srun ")]


# --- pyxis: the launcher's dry run and the cell's plan --------------------------------------------


@pytest.mark.integration
def test_a_routed_pyxis_cell_runs_on_the_host_and_its_engines_in_the_image(make_runners, tmp_path):
    cell, runners = make_cell(
        make_runners, tmp_path, "h200", "pyxis", "vllm/vllm-openai:v0.33.0", engine="vllm"
    )
    assert cell.routed and cell.nodes == 1
    lines = dry_run("h200", launcher_env(cell, runners, tmp_path / "r", dict(os.environ)))
    step, engine_step = srun_lines(lines)
    assert step[-2:] == ["bash", str(REPO / "runners" / "lib" / "step.sh")]
    assert not any(w.startswith("--container") for w in step), step  # the cell: host side
    exported = next(w for w in step if w.startswith("--export=")).split("=", 1)[1].split(",")
    assert {CELL_ON_HOST_VAR, CONTAINER_ARGS_VAR} <= set(exported)
    assert "--overlap" in engine_step and any(w.startswith("--container-image=") for w in engine_step)
    assert any("host side of node 0" in line for line in lines)


@pytest.mark.integration
def test_a_single_engine_pyxis_cell_still_runs_wholly_in_the_image(make_runners, tmp_path):
    cell, runners = make_cell(
        make_runners, tmp_path, "h200", "pyxis", "vllm/vllm-openai:v0.33.0", engine="vllm", replicas=1
    )
    assert not cell.routed
    lines = dry_run("h200", launcher_env(cell, runners, tmp_path / "r", dict(os.environ)))
    (step,) = srun_lines(lines)
    assert any(w.startswith("--container-image=") for w in step)
    exported = next(w for w in step if w.startswith("--export=")).split("=", 1)[1].split(",")
    assert CONTAINER_ARGS_VAR not in exported and not any("host side" in line for line in lines)


@pytest.mark.integration
def test_a_single_engine_pyxis_cell_gets_the_accuracy_harness_mounted_at_its_path(make_runners, tmp_path):
    """The cell runs the accuracy gate inside the image: the harness built with the image's Python on a
    shared path (AGENTSWEEP_LMEVAL_VENV) is mounted there, and the variable reaches the container."""
    cell, runners = make_cell(
        make_runners, tmp_path, "h200", "pyxis", "vllm/vllm-openai:v0.33.0", engine="vllm", replicas=1
    )
    venv = tmp_path / "lmeval"
    venv.mkdir()
    env = {
        **launcher_env(cell, runners, tmp_path / "r", dict(os.environ)),
        "AGENTSWEEP_LMEVAL_VENV": str(venv),
    }
    (step,) = srun_lines(dry_run("h200", env))
    mounts = next(w for w in step if w.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert f"{venv}:{venv}" in mounts
    exported = next(w for w in step if w.startswith("--export=")).split("=", 1)[1].split(",")
    assert "AGENTSWEEP_LMEVAL_VENV" in exported


def test_the_host_side_plan_starts_each_engine_as_a_container_step_and_the_router_here(
    make_runners, tmp_path
):
    """What `agentsweep cell` plans inside such a step: each vLLM replica an `srun --overlap` step with
    pyxis's flags, the host's interpreter settings left out of it, its GPUs chosen inside; the router
    with this interpreter, on loopback."""
    cell, _ = make_cell(make_runners, tmp_path, "h200", "pyxis", "vllm/vllm-openai:v0.33.0", engine="vllm")
    flags = "--container-image=/sq/vllm.sqsh --container-mounts=/repo:/repo --no-container-mount-home"
    environ = {
        "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpunode1", "AS_CONTAINER_RUNTIME": "pyxis",
        CELL_ON_HOST_VAR: "1", CONTAINER_ARGS_VAR: flags, "CUDA_VISIBLE_DEVICES": "0,1",
    }  # fmt: skip
    plan = plan_cell(
        cell, tmp_path / "r", ports=DryRunPortAllocator(), python="/host/venv/bin/python", environ=environ,
        placement=from_environ(cell, environ),
    )  # fmt: skip
    assert plan.placement is not None and plan.placement.runtime == "pyxis"
    for k, inst in enumerate(plan.instances):
        argv = inst.engine.argv
        unset = argv[: argv.index("srun")]
        assert unset[0] == "env" and {unset[i + 1] for i in range(1, len(unset), 2)} == set(HOST_ONLY_NAMES)
        srun = argv[argv.index("srun") :]
        assert srun[1:7] == [
            "--jobid=42",
            "--nodes=1",
            "--ntasks=1",
            "--nodelist=gpunode1",
            "--overlap",
            "--kill-on-bad-exit=1",
        ]
        assert "--gres=gpu:h200:2" in srun and shlex.split(flags) == srun[8:11]
        select = srun[srun.index("select-gpus") + 1 : srun.index("select-gpus") + 4]
        assert select == [str(k), "1", "nvidia"]
        assert argv[argv.index("nvidia") + 1 :][:2] == ["vllm", "serve"]
        assert inst.url.startswith("http://127.0.0.1:")  # one node: the replicas on its loopback
    assert plan.router is not None and plan.router.argv[0] == "/host/venv/bin/python"
    record = plan.scaleout_record()
    assert record["placement"]["runtime"] == "pyxis"


# --- docker, for real (podman) --------------------------------------------------------------------


@pytest.fixture(scope="session")
def podman_docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[container_image.PodmanDocker]:
    """podman behind a `docker` script and an image built here, or a one-line skip saying why not."""
    if not VENV_PYTHON.exists():
        pytest.skip("the repository's .venv is missing")
    tag = f"localhost/agentsweep-test-engine:{os.getpid()}"
    try:
        found = container_image.podman_docker(tmp_path_factory.mktemp("podman"), VENV_PYTHON, tag)
    except (container_image.Unavailable, OSError, subprocess.SubprocessError) as err:
        line = f"no container runtime: {err}"
        if os.environ.get("AGENTSWEEP_REQUIRE_CONTAINERS") == "1":
            pytest.fail(line + " (AGENTSWEEP_REQUIRE_CONTAINERS=1)", pytrace=False)
        pytest.skip(line)
    try:
        yield found
    finally:
        container_image.remove_image(tag)


def nothing_left_of(ids: set[str]) -> list[str]:
    """What still runs of containers ``ids`` a few seconds on (their engines, their conmon); [] when
    nothing. Whatever is found is killed once seen, so that a failing test leaves nothing behind."""
    poll_until(lambda: not container_image.processes_of(ids), timeout=10, interval=0.2)
    left = container_image.processes_of(ids)
    container_image.kill_processes_of(ids)
    return left


def docker_env(podman_docker: container_image.PodmanDocker) -> dict[str, str]:
    return {**os.environ, "PATH": f"{podman_docker.bin_dir}{os.pathsep}{os.environ['PATH']}"}


def stubborn_container(podman_docker: container_image.PodmanDocker, name: str, job: str) -> str:
    """An engine instance's container (named, labelled with ``job``) whose main process ignores
    SIGTERM, as an engine still starting up does (PID 1 of its namespace, no handler yet): a graceful
    stop of it waits out the whole stop timeout. Its id."""
    run = subprocess.run(
        ["docker", "run", "-d", "--rm", "--name", name, "--label", f"agentsweep.job={job}",
         "--network", "host", podman_docker.image, "sleep", "600"],
        env=docker_env(podman_docker), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def status_of(name: str) -> str:
    out = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Status}}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return out.stdout.strip()


@pytest.mark.integration
@pytest.mark.slow
def test_the_job_cleanup_ends_a_container_that_a_killed_removal_left_stopping(podman_docker):
    """podman's `rm --force` stops a container gracefully (up to its stop timeout); killed part way (a
    task epilog at the end of its step's KillWait, a `timeout`), it leaves the container "Stopping",
    and a later `rm --force` then deletes only podman's record of it while the engine and its conmon
    run on. The cleanup by the job's label ends such a container for good."""
    job = f"t{os.getpid()}a"
    name = f"agentsweep-test-{job}-0"
    cid = stubborn_container(podman_docker, name, job)
    try:
        removal = subprocess.Popen(
            ["docker", "rm", "--force", name], env=docker_env(podman_docker),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert poll_until(lambda: status_of(name) == "Stopping", timeout=30, interval=0.1), status_of(name)
        removal.kill()
        removal.wait(timeout=30)
        assert status_of(name) == "Stopping"
        cleanup = subprocess.run(
            ["bash", "-c", f'source "$1/common.sh" && source "$1/container.sh" && as_remove_job_containers {job}',
             "cleanup", str(REPO / "runners" / "lib")],
            env=docker_env(podman_docker), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert cleanup.returncode == 0, cleanup.stderr
        assert container_image.containers(f"agentsweep.job={job}") == []
        assert nothing_left_of({cid}) == []
    finally:
        container_image.kill_processes_of({cid})
        subprocess.run(["podman", "rm", "--force", "--time", "0", cid], capture_output=True, timeout=60)


@pytest.mark.integration
@pytest.mark.slow
def test_the_task_epilog_ends_an_engine_container_well_within_the_kill_wait(podman_docker):
    """The epilog of an engine's step (docker_epilog.sh) runs while the step is being killed, and is
    itself killed at the end of the step's KillWait (5 s on the test cluster, 30 s by default): it ends
    the container at once rather than waiting out a graceful stop the engine may never honour."""
    job = f"t{os.getpid()}b"
    name = f"agentsweep-test-{job}-0"
    cid = stubborn_container(podman_docker, name, job)
    try:
        epilog = subprocess.run(
            ["timeout", "--signal=KILL", "3", "bash", str(REPO / "runners" / "lib" / "docker_epilog.sh")],
            env={**docker_env(podman_docker), "AS_DOCKER_CONTAINER": name},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert epilog.returncode == 0, (epilog.returncode, status_of(name))
        assert container_image.containers(f"agentsweep.job={job}") == []
        assert nothing_left_of({cid}) == []
    finally:
        container_image.kill_processes_of({cid})
        subprocess.run(["podman", "rm", "--force", "--time", "0", cid], capture_output=True, timeout=60)


def launch_watching_containers(
    env: dict[str, str], podman_docker: container_image.PodmanDocker
) -> tuple[str, set[str], set[str]]:
    """Run the MI355X launcher with docker (podman here) to the end, watching its containers: the job
    id, the names of the engine containers seen running, and the ids of every container it started."""
    env = {
        **env,
        "PATH": f"{podman_docker.bin_dir}{os.pathsep}{env['PATH']}",
        "AGENTSWEEP_DOCKER_DEVICES": "",  # no GPU devices on this machine
        "AGENTSWEEP_SHM_SIZE": "",  # podman refuses --shm-size beside --ipc host
    }
    proc = subprocess.Popen(
        ["bash", str(REPO / "runners" / "launch_mi355x.sh")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    seen: set[str] = set()
    ids: set[str] = set()

    def done() -> bool:
        seen.update(container_image.containers("agentsweep.job", running_only=True))
        ids.update(container_image.container_ids(podman_docker.image, "agentsweep.job"))
        return proc.poll() is not None

    try:
        poll_until(done, timeout=240, interval=0.5)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    job = re.search(r"Granted job allocation (\d+)", err).group(1)  # type: ignore[union-attr]
    return job, seen, ids


@pytest.mark.slurm
@pytest.mark.slow
def test_a_routed_cell_under_docker_runs_its_router_on_the_host_and_engines_in_containers(
    slurm, podman_docker, make_runners, tmp_path
):
    """The MI355X launcher, runtime docker (podman here), two simulated replicas behind smg: the engines
    run in containers of the image (seen while the cell runs, each named for its job and instance),
    the router with the runner's interpreter; every check passes and no container outlives the cell."""
    cell, runners = make_cell(make_runners, tmp_path, "mi355x", "docker", podman_docker.image)
    result = tmp_path / "result"
    job, seen, ids = launch_watching_containers(launcher_env(cell, runners, result, slurm.env), podman_docker)
    assert (result / "status.txt").read_text().splitlines()[0] == "SUCCESS"
    record = json.loads((result / "cell.json").read_text())
    so = record["scaleout"]
    names = [f"agentsweep-{cell.exp_name}-{job}-{k}" for k in range(2)]
    assert set(names) <= seen, seen
    for k, inst in enumerate(so["replicas"]):
        argv = inst["command"]
        run = argv[argv.index("docker") :]
        assert run[:5] == ["docker", "run", "--rm", "--name", names[k]]
        assert f"agentsweep.job={job}" in run and podman_docker.image in run
        assert "--shm-size" not in run and "--device" not in run
        assert f"--task-epilog={REPO}/runners/lib/docker_epilog.sh" in argv
    assert so["placement"]["runtime"] == "docker"
    assert so["router"]["command"][0] == str(VENV_PYTHON)  # the runner's interpreter, on the host
    assert record["versions"]["router"].startswith("smg ")
    summary = json.loads((result / "summary.json").read_text())
    assert summary["counts"]["ok"] > 0 and summary["validity"]["valid"], summary["validity"]
    router = json.loads((result / "router.json").read_text())
    assert sum(router["requests_by_replica"]) >= summary["counts"]["ok"]
    assert container_image.containers(f"agentsweep.job={job}") == []
    assert nothing_left_of(ids) == []
    assert slurm.jobs() == []


@pytest.mark.slurm
@pytest.mark.slow
def test_an_interrupted_docker_cell_leaves_no_engine_container(slurm, podman_docker, make_runners, tmp_path):
    """SIGTERM to the launcher while both engine containers run: the cell stops, the job is released
    and neither container is left (the steps' epilog and the cleanup by the job's label)."""
    cell, runners = make_cell(make_runners, tmp_path, "mi355x", "docker", podman_docker.image, duration=120)
    env = launcher_env(cell, runners, tmp_path / "result", slurm.env)
    env["PATH"] = f"{podman_docker.bin_dir}{os.pathsep}{env['PATH']}"
    env["AGENTSWEEP_DOCKER_DEVICES"] = ""
    env["AGENTSWEEP_SHM_SIZE"] = ""
    proc = subprocess.Popen(
        ["bash", str(REPO / "runners" / "launch_mi355x.sh")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        poll_until(
            lambda: len(container_image.containers("agentsweep.job", running_only=True)) == 2,
            timeout=120,
            interval=0.5,
        )
        running = container_image.containers("agentsweep.job", running_only=True)
        ids = container_image.container_ids(podman_docker.image, "agentsweep.job")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err[-3000:]
    job = re.search(r"Granted job allocation (\d+)", err).group(1)  # type: ignore[union-attr]
    assert all(name.endswith((f"-{job}-0", f"-{job}-1")) for name in running), running
    assert container_image.containers(f"agentsweep.job={job}") == []
    assert len(ids) == 2 and nothing_left_of(ids) == []
    assert slurm.jobs() == []


@pytest.mark.slurm
@pytest.mark.slow
def test_a_two_node_cell_under_docker_makes_its_slurm_calls_on_the_host(slurm2, podman_docker, tmp_path):
    """Two replicas on two nodes of one GPU each, under docker: the cell (on the host of node 0) binds
    each node's ports there and starts each engine as a container step on its node, at the node's own
    address; the image has no Slurm client, and needs none."""
    runners = tmp_path / "runners.yaml"
    runners.write_text(
        "mi355x: {runs_on: [self-hosted, slurm, mi355x], launcher: runners/launch_mi355x.sh,"
        " gpus_per_node: 1, max_nodes: 2, gres_type: mi355x, cpu_dram_gb: 64, partition: mi355x,"
        " account: null, time_limit_min: 30, exclude: [], container_runtime: docker, hf_cache: null}\n"
    )
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        SWEEP.format(
            runner="mi355x", engine="sim", image=podman_docker.image, duration=6, speed=50,
            engine_args="--hardware mi355x --num-gpu-blocks-override 4096", replicas=2,
            router=", router: [round_robin]",
        )
    )  # fmt: skip
    (cell,) = select_cells(sweep, ["ct"], runners=load_runners(runners))
    assert cell.nodes == 2
    no_slurm = subprocess.run(
        ["docker", "run", "--rm", podman_docker.image, "bash", "-c", "command -v srun scontrol"],
        env={**os.environ, "PATH": f"{podman_docker.bin_dir}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert no_slurm.returncode != 0 and no_slurm.stdout == ""
    result = tmp_path / "result"
    job, _, ids = launch_watching_containers(launcher_env(cell, runners, result, slurm2.env), podman_docker)
    record = json.loads((result / "cell.json").read_text())
    assert record["status"] == "SUCCESS", (result / "status.txt").read_text()
    so = record["scaleout"]
    nodes = {n["name"]: n for n in so["placement"]["nodes"]}
    assert {n: v["address"] for n, v in nodes.items()} == {"gpunode1": "127.0.0.2", "gpunode2": "127.0.0.3"}
    assert nodes["gpunode2"]["bound_on"] == "gpunode2" and nodes["gpunode2"]["bound_by_step"] == f"{job}.1"
    for inst in so["replicas"]:
        node = nodes[inst["node"]]
        assert inst["url"] == f"http://{node['address']}:{node['ports'][0]}"
        assert f"--nodelist={inst['node']}" in inst["command"] and "docker" in inst["command"]
    assert [r["node"] for r in so["replicas"]] == ["gpunode1", "gpunode2"]
    assert container_image.containers(f"agentsweep.job={job}") == []
    assert len(ids) == 2 and nothing_left_of(ids) == []  # neither node's engine, nor its conmon
    assert slurm2.jobs() == []
