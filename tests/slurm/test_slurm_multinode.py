"""Cells spanning several nodes: one allocation of N nodes, one job step per engine instance.

The cluster tests run on `slurm_cluster2` (two slurmds on this host, see conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from agentsweep.cell.placement import Placement, Slot, bind_ports, node_gpus, pack, plan_placement
from agentsweep.cell.plan import plan_cell
from agentsweep.cell.port_allocation import DryRunPortAllocator
from agentsweep.commands.allocation import runner_assignments
from agentsweep.config import load_runners, select_cells
from agentsweep.config.matrix import nodes_needed
from agentsweep.contract.cell import CELL_ENV_VAR, Cell
from agentsweep.errors import InputError, RunError

from tests.support import poll_until

REPO = Path(__file__).resolve().parents[2]

SWEEP = """\
mn:
  runner: h200
  engine: sim
  model: meta-llama/Llama-3.3-70B-Instruct
  precision: fp8
  image: ""
  duration: {duration}
  speed: 50
  traces: kv-cache-tester/sample_traces
  replay: {{max_context: 65536, warmup_requests: 0, max_delay: 1}}
  engine_args: --hardware h200 --num-gpu-blocks-override 4096
  router_program: smg
  validity: {{max_throughput_drift: 5.0}}
  search_space:
    tp{tp}: {{users: 4, offload: [off], replicas: {replicas}, router: [round_robin]}}
"""


# A prefill/decode point for the same runner: one prefill and one decode instance of one GPU each.
PD_SPACE = (
    "  - {users: 4, offload: off, prefill: {replicas: 1, tp: 1}, decode: {replicas: 1, tp: 1},"
    " router: [round_robin]}"
)
# Distinct from the runner defaults (intra 450, inter 50): the decode must carry this one when it is
# on another node than its prefill.
INTER_NODE_GBS = 37.5
INTRA_NODE_GBS = 321.0


def runners_file(path: Path, gpus_per_node: int, max_nodes: int) -> Path:
    path.write_text(
        "h200: {runs_on: [self-hosted, slurm, h200], launcher: runners/launch_h200.sh,"
        f" gpus_per_node: {gpus_per_node}, max_nodes: {max_nodes}, gres_type: h200, cpu_dram_gb: 64,"
        " partition: h200, account: null, time_limit_min: 30, exclude: [], container_runtime: none,"
        f" hf_cache: null, intra_node_gbs: {INTRA_NODE_GBS:g}, inter_node_gbs: {INTER_NODE_GBS:g}}}\n"
    )
    return path


def make_cell(tmp_path: Path, *, gpus_per_node: int = 1, replicas: int = 2, tp: int = 1, duration: int = 6):
    runners = runners_file(tmp_path / "runners.yaml", gpus_per_node, max_nodes=2)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP.format(duration=duration, tp=tp, replicas=replicas))
    (cell,) = select_cells(sweep, ["mn"], runners=load_runners(runners))
    return cell, runners


def make_pd_cell(tmp_path: Path, program: str, *, gpus_per_node: int = 1, duration: int = 8):
    """Prefill 1x1 + decode 1x1 behind ``program``: on two nodes when a node holds one GPU."""
    runners = runners_file(tmp_path / "runners.yaml", gpus_per_node, max_nodes=2)
    head = SWEEP.format(duration=duration, tp=1, replicas=1).split("  search_space:")[0]
    head = head.replace("router_program: smg", f"router_program: {program}")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(head + "  search_space:\n" + PD_SPACE + "\n")
    (cell,) = select_cells(sweep, ["mn"], runners=load_runners(runners))
    return cell, runners


def launcher_env(cell: Cell, runners: Path, result_dir: Path, base: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in (CELL_ENV_VAR, "PORT")}
    env.update(
        {CELL_ENV_VAR: cell.to_json(), "AGENTSWEEP_RUNNERS": str(runners), "RESULT_DIR": str(result_dir)}
    )
    return env


# --- no cluster needed ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tps", "per_node"),
    [([1, 1], 1), ([2, 2, 2], 4), ([4, 2, 2, 4], 4), ([3, 3, 3], 3), ([1, 2, 1, 4], 4)],
)
def test_pack_agrees_with_the_matrix(tps, per_node):
    placed = pack(tps, per_node)
    assert max(node for node, _ in placed) + 1 == nodes_needed(tps, per_node)
    for node in {n for n, _ in placed}:  # no node holds more than it has, no GPU twice
        used = [(off, tp) for (n, off), tp in zip(placed, tps, strict=True) if n == node]
        assert sum(tp for _, tp in used) <= per_node
        positions = [p for off, tp in used for p in range(off, off + tp)]
        assert len(positions) == len(set(positions))
    assert node_gpus([2, 2, 2], 4) == 4 and node_gpus([1, 1], 1) == 1 and node_gpus([4, 2], 8) == 6


def test_allocation_exports_nodes_and_gpus_per_node(tmp_path):
    cell, runners = make_cell(tmp_path, gpus_per_node=4, replicas=3, tp=2)
    assert cell.nodes == 2 and cell.gpus == 6
    values = runner_assignments("h200", cell, {"RESULT_DIR": str(tmp_path)}, runners)
    assert values["AS_NODES"] == "2" and values["AS_NODE_GPUS"] == "4" and values["AS_GPUS"] == "6"
    (tmp_path / "one").mkdir()
    one, runners1 = make_cell(tmp_path / "one", gpus_per_node=8, replicas=2, tp=2)
    values1 = runner_assignments("h200", one, {"RESULT_DIR": str(tmp_path)}, runners1)
    assert values1["AS_NODES"] == "1" and values1["AS_NODE_GPUS"] == "4"


def _dry_run(cell, runners, tmp_path: Path) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """The launcher's dry run of the cell (what it would ask Slurm for); it must succeed."""
    env = launcher_env(cell, runners, tmp_path / "r", dict(os.environ))
    env["AGENTSWEEP_DRY_RUN"] = "1"
    proc = subprocess.run(
        ["bash", str(REPO / "runners" / "launch_h200.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.integration
def test_dry_run_of_a_two_node_cell_asks_for_two_nodes(tmp_path):
    cell, runners = make_cell(tmp_path)
    assert cell.nodes == 2
    proc = _dry_run(cell, runners, tmp_path)
    lines = proc.stdout.splitlines()
    salloc = shlex.split(lines[0])
    assert salloc[0] == "salloc" and "--nodes=2" in salloc and "--ntasks-per-node=1" in salloc
    assert "--gres=gpu:h200:1" in salloc and "--ntasks=1" not in salloc
    step = shlex.split(lines[-1])
    assert step[:2] == ["srun", "--jobid=JOBID"] and "--overlap" in step and "--nodelist=NODE" in step


@pytest.mark.integration
def test_dry_run_of_a_one_node_cell_is_unchanged(tmp_path):
    cell, runners = make_cell(tmp_path, gpus_per_node=2)
    assert cell.nodes == 1
    proc = _dry_run(cell, runners, tmp_path)
    salloc, srun = proc.stdout.splitlines()
    assert {"--nodes=1", "--ntasks=1", "--gres=gpu:h200:2"} <= set(shlex.split(salloc))
    assert "--overlap" not in srun


@pytest.mark.parametrize(
    ("engine", "program"), [("sim", "smg"), ("sim", "vllm-router"), ("vllm", "vllm-router")]
)
def test_a_prefill_on_another_node_is_reached_at_that_nodes_address(tmp_path, engine, program):
    """Every address a prefill/decode pair meets at is the instance's node address, never loopback:
    the engine binds it, the router's URLs (and smg's bootstrap ports, whose host is the URL's) name
    it, and vLLM's NIXL handshake listens on it. The nodes' addresses here are names that are never
    contacted (a dry-run plan binds nothing)."""
    as_engine = {"engine": engine, "engine_args": "", "speed": 50 if engine == "sim" else 1}
    cell, _ = make_pd_cell(tmp_path, program)
    cell = cell.replace(**as_engine)
    addresses = {"gpunode1": "node-a.test", "gpunode2": "node-b.test"}
    placement = Placement(
        job_id="7", nodes=["gpunode1", "gpunode2"], addresses=addresses,
        slots=[Slot(0, "gpunode1", "node-a.test", 0, 1), Slot(1, "gpunode2", "node-b.test", 0, 1)],
        gres_type="h200", node_gpus=1, container_args=[], vendor="none" if engine == "sim" else "nvidia",
    )  # fmt: skip
    assert cell.node.hardware == "h200" and cell.kv_transfer_gbs == INTER_NODE_GBS  # resolved by the matrix
    plan = plan_cell(
        cell, tmp_path / "r", ports=DryRunPortAllocator(), host="127.0.0.1", python="python",
        environ={}, scrape_interval_s=1.0, placement=placement,
    )  # fmt: skip
    p0, d0 = plan.instances
    assert (p0.url, d0.url) == ("http://node-a.test:$PREFILL0_PORT", "http://node-b.test:$DECODE0_PORT")
    for r, address in ((p0, "node-a.test"), (d0, "node-b.test")):
        argv = r.engine.argv
        assert argv[argv.index("--host") + 1] == address
        if engine == "vllm":  # the decode's NIXL agent dials the prefill's handshake on its node
            assert r.engine.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == address
    assert plan.router is not None
    router = plan.router.argv
    prefill = router[router.index("--prefill") + 1 :]
    if program == "smg":  # smg: the bootstrap server is at the prefill URL's host, on this port
        assert prefill[:2] == ["http://node-a.test:$PREFILL0_PORT", "$PREFILL0_BOOTSTRAP_PORT"]
        assert p0.engine.argv[p0.engine.argv.index("--disaggregation-bootstrap-port") + 1] == prefill[1]
    else:
        assert prefill[0] == "http://node-a.test:$PREFILL0_PORT"
    assert router[router.index("--decode") + 1] == "http://node-b.test:$DECODE0_PORT"
    assert router[router.index("--host") + 1] == "127.0.0.1"  # the router itself stays on node 0's loopback
    (tmp_path / "one").mkdir()
    one, _ = make_pd_cell(tmp_path / "one", program, gpus_per_node=2)  # both on one node, no placement
    local = plan_cell(
        one.replace(**as_engine), tmp_path / "r1", ports=DryRunPortAllocator(),
        host="127.0.0.1", python="python", environ={}, scrape_interval_s=1.0,
    )  # fmt: skip
    assert all("VLLM_NIXL_SIDE_CHANNEL_HOST" not in r.engine.env for r in local.instances)


# --- on the two-node cluster -------------------------------------------------------------------


def allocate(slurm, *args: str) -> str:
    proc = slurm.run("salloc", "--no-shell", "--time=5", *args)
    return re.search(r"Granted job allocation (\d+)", proc.stderr).group(1)  # type: ignore[union-attr]


def steps(slurm, job: str) -> list[tuple[str, str]]:
    out = slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%i %N").stdout
    return [tuple(line.split()) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


@pytest.mark.slurm
def test_placement_puts_node_zero_first_and_refuses_a_short_allocation(slurm2, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm2.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", slurm2.env["PATH"])
    cell, _ = make_cell(tmp_path, gpus_per_node=2, replicas=3, tp=1)  # 2 on the first node, 1 on the second
    job = allocate(slurm2, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:h200:2")
    try:
        env = {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "gpunode2"}
        placement = plan_placement(cell, gpus_per_node=2, gres_type="h200", vendor="nvidia", environ=env)
        assert placement is not None
        assert placement.nodes == ["gpunode2", "gpunode1"]  # the cell's node first: it runs the router
        assert placement.addresses == {"gpunode1": "127.0.0.2", "gpunode2": "127.0.0.3"}  # NodeAddr
        assert [(s.node, s.gpu_offset) for s in placement.slots] == [
            ("gpunode2", 0),
            ("gpunode2", 1),
            ("gpunode1", 0),
        ]
        assert plan_placement(cell, gpus_per_node=2, gres_type="", vendor="none", environ={}) is None
    finally:
        slurm2.run("scancel", job)
    one = allocate(slurm2, "--nodes=1", "--ntasks=1")
    try:
        with pytest.raises(InputError, match=r"spans 2 nodes but job \d+ has 1 \(gpunode1\)"):
            plan_placement(
                cell, gpus_per_node=2, gres_type="h200", vendor="nvidia", environ={"SLURM_JOB_ID": one}
            )
    finally:
        slurm2.run("scancel", one)


@pytest.mark.slurm
@pytest.mark.parametrize("vendor", ["nvidia", "amd"])
def test_each_instance_step_lands_on_its_node_with_its_own_gpus(slurm2, tmp_path, monkeypatch, vendor):
    monkeypatch.setenv("SLURM_CONF", slurm2.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", slurm2.env["PATH"])
    cell, _ = make_cell(tmp_path, gpus_per_node=2, replicas=4, tp=1)
    job = allocate(slurm2, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:h200:2")
    try:
        env = {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "gpunode1"}
        placement = plan_placement(cell, gpus_per_node=2, gres_type="h200", vendor=vendor, environ=env)
        assert placement is not None
        show = 'echo "$SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES-} ${ROCR_VISIBLE_DEVICES-} ${HIP_VISIBLE_DEVICES-}"'
        procs = [
            subprocess.Popen(
                placement.wrap(i, ["bash", "-c", show]), env=slurm2.env, stdout=subprocess.PIPE, text=True
            )
            for i in range(4)
        ]
        seen = [p.communicate(timeout=60)[0].split() for p in procs]
    finally:
        slurm2.run("scancel", job)
    if vendor == "nvidia":  # the step's list, the instance's position of it
        assert seen == [["gpunode1", "0"], ["gpunode1", "1"], ["gpunode2", "0"], ["gpunode2", "1"]]
    else:  # ROCm: the node's list in ROCR_VISIBLE_DEVICES, the instance's index in HIP_VISIBLE_DEVICES
        assert seen == [
            ["gpunode1", "0,1", "0"],
            ["gpunode1", "0,1", "1"],
            ["gpunode2", "0,1", "0"],
            ["gpunode2", "0,1", "1"],
        ]


@pytest.mark.slurm
def test_terminating_an_instances_srun_ends_its_step_on_the_node(slurm2, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm2.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", slurm2.env["PATH"])
    cell, _ = make_cell(tmp_path)
    job = allocate(slurm2, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:h200:1")
    marker = f"agentsweep-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        placement = plan_placement(
            cell, gpus_per_node=1, gres_type="h200", vendor="none", environ={"SLURM_JOB_ID": job}
        )
        assert placement is not None
        argv = placement.wrap(1, ["bash", "-c", "sleep 120; : " + marker])
        proc = subprocess.Popen(argv, env=slurm2.env, start_new_session=True)
        poll_until(lambda: steps(slurm2, job), timeout=30, interval=0.2)
        assert steps(slurm2, job) == [(f"{job}.0", "gpunode2")]
        # squeue lists a step before slurmstepd has started it, and srun's own command line holds
        # the marker too (every node runs on this host): wait for the step's program itself, or
        # the signal lands mid-launch and Slurm leaves the half-launched step behind for a while.
        step_program = rf"^\S*bash -c sleep 120; : {marker}$"  # slurmstepd runs it by full path
        assert poll_until(
            lambda: subprocess.run(["pgrep", "-f", step_program], capture_output=True).returncode == 0,
            timeout=30,
            interval=0.2,
        )
        os.killpg(proc.pid, signal.SIGTERM)  # what the cell does to stop an instance
        proc.wait(timeout=30)
        poll_until(lambda: not steps(slurm2, job), timeout=15, interval=0.2)
        assert steps(slurm2, job) == []
        # the step's program is killed with it (on a loaded machine it may outlive the listing briefly)
        assert poll_until(
            lambda: subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1,
            timeout=15,
            interval=0.2,
        )
    finally:
        slurm2.run("scancel", job)


def engine_sim_ready() -> bool:
    return (REPO / ".venv" / "bin" / "python").exists() and (REPO / "benchmarks" / "run_cell.sh").exists()


def watch_steps(slurm, stop_when, timeout: float) -> set[tuple[str, str]]:
    """Every (step, node) squeue showed while ``stop_when()`` is false."""
    seen: set[tuple[str, str]] = set()

    def stopped() -> bool:
        if stop_when():
            return True
        out = slurm.run("squeue", "-h", "-s", "-o", "%i %N", check=False).stdout
        seen.update(tuple(line.split()) for line in out.splitlines() if line.strip())  # type: ignore[misc]
        return False

    poll_until(stopped, timeout=timeout, interval=0.3)
    return seen


def _assert_steps_on_both_nodes(job: str, seen: set[tuple[str, str]]) -> None:
    """Step 0 is the cell on node 0; step 1 binds node 1's ports there (it may end before squeue shows
    it); the two instances are steps 2 and 3, one on each node (their step numbers follow the order
    their sruns reach slurmctld, which the parallel start does not fix; which instance is on which
    node is checked in cell.json)."""
    assert (f"{job}.0", "gpunode1") in seen, seen
    assert {node for step, node in seen if step == f"{job}.1"} <= {"gpunode2"}, seen
    instances = {(step, node) for step, node in seen if step in (f"{job}.2", f"{job}.3")}
    assert {step for step, _ in instances} == {f"{job}.2", f"{job}.3"}, seen
    assert {node for _, node in instances} == {"gpunode1", "gpunode2"}, seen


def _assert_ports_bound_on_their_nodes(job: str, record: dict) -> None:  # type: ignore[type-arg]
    """Every instance listens at its node's own address, on a port that a process on that node bound
    there before the engines started: node 0's the cell itself (step 0), node 1's a step of its own."""
    nodes = {n["name"]: n for n in record["scaleout"]["placement"]["nodes"]}
    assert {name: n["address"] for name, n in nodes.items()} == {
        "gpunode1": "127.0.0.2",
        "gpunode2": "127.0.0.3",
    }
    assert nodes["gpunode1"]["bound_by_step"] == f"{job}.0"
    assert nodes["gpunode2"]["bound_by_step"] == f"{job}.1"
    for name, node in nodes.items():
        assert node["bound_on"] == name, node
    for inst in record["scaleout"]["replicas"]:
        url = urlsplit(inst["url"])
        node = nodes[inst["node"]]
        assert url.hostname == node["address"] and url.port in node["ports"], (inst, node)
        extra = [v for k, v in inst["env"].items() if k.endswith("_PORT")]  # KV handshake ports
        for port in [inst.get("bootstrap_port"), *extra]:
            if port is not None:
                assert int(port) in node["ports"], (inst, node)


def _launch_on_two_nodes(slurm2, cell, runners, result: Path) -> tuple[str, set[tuple[str, str]]]:  # type: ignore[no-untyped-def]
    """Run the cell through the real launcher; its job id and the (step, node) pairs seen while it ran."""
    env = launcher_env(cell, runners, result, slurm2.env)
    proc = subprocess.Popen(
        ["bash", str(REPO / "runners" / "launch_h200.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        seen = watch_steps(slurm2, lambda: proc.poll() is not None, 150)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    job = re.search(r"Granted job allocation (\d+)", err).group(1)  # type: ignore[union-attr]
    return job, seen


@pytest.mark.slurm
@pytest.mark.slow
def test_two_node_cell_through_the_launcher(slurm2, tmp_path):
    if not engine_sim_ready():
        pytest.skip("the repository's .venv or benchmarks/run_cell.sh is missing")
    cell, runners = make_cell(tmp_path)
    result = tmp_path / "result"
    job, seen = _launch_on_two_nodes(slurm2, cell, runners, result)
    _assert_steps_on_both_nodes(job, seen)
    assert (result / "status.txt").read_text().splitlines()[0] == "SUCCESS"
    record = json.loads((result / "cell.json").read_text())
    assert record["status"] == "SUCCESS"
    assert [r["node"] for r in record["scaleout"]["replicas"]] == ["gpunode1", "gpunode2"]
    assert record["scaleout"]["placement"]["router_node"] == "gpunode1"
    assert record["scaleout"]["replicas"][1]["command"][:5] == [
        "srun",
        f"--jobid={job}",
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=gpunode2",
    ]
    _assert_ports_bound_on_their_nodes(job, record)
    summary = json.loads((result / "summary.json").read_text())
    assert summary["counts"]["ok"] > 0
    assert slurm2.jobs() == []


@pytest.mark.slurm
@pytest.mark.slow
def test_the_cell_itself_ends_its_instance_steps(slurm2, tmp_path):
    """Run the cell script as step 0 of a hand-made allocation: when it ends, the job is still there
    but none of its instance steps is (the launcher's scancel is not what stopped them)."""
    if not engine_sim_ready():
        pytest.skip("the repository's .venv or benchmarks/run_cell.sh is missing")
    cell, runners = make_cell(tmp_path)
    result = tmp_path / "result"
    job = allocate(slurm2, "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:h200:1")
    try:
        env = launcher_env(cell, runners, result, slurm2.env)
        proc = subprocess.Popen(
            [
                "srun",
                f"--jobid={job}",
                "--nodes=1",
                "--ntasks=1",
                "--export=ALL",
                str(REPO / "benchmarks" / "run_cell.sh"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
        )
        seen = watch_steps(slurm2, lambda: proc.poll() is not None, 150)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out[-3000:]
        assert {n for s, n in seen if s in (f"{job}.2", f"{job}.3")} == {"gpunode1", "gpunode2"}, seen
        assert any("RUNNING" in j for j in slurm2.jobs())  # the allocation outlives the cell ...
        # ... but no step does: the cell's own (step 0, whose srun just returned) and its instances' may
        # take slurmctld a moment to record as ended, never a scancel.
        assert poll_until(lambda: not steps(slurm2, job), timeout=15, interval=0.2), steps(slurm2, job)
    finally:
        slurm2.run("scancel", job)
    assert (result / "status.txt").read_text().splitlines()[0] == "SUCCESS"


@pytest.mark.integration
def test_a_prefill_decode_cell_on_two_nodes_models_the_inter_node_transfer(tmp_path):
    """Prefill 1x1 + decode 1x1 on a runner of one GPU per node spans two nodes; the simulated decode is
    told the runner's inter_node_gbs (the same shape on one node of two GPUs: intra_node_gbs)."""
    shown = {}
    for per_node in (1, 2):
        (tmp_path / str(per_node)).mkdir()
        cell, runners = make_pd_cell(tmp_path / str(per_node), "smg", gpus_per_node=per_node)
        env = launcher_env(cell, runners, tmp_path / str(per_node) / "r", dict(os.environ))
        proc = subprocess.run(
            [sys.executable, "-m", "agentsweep.cli", "cell", "--dry-run"],
            env=env, capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        decode = next(line for line in proc.stdout.splitlines() if line.startswith("decode 0:"))
        words = shlex.split(decode.split(":", 1)[1])
        shown[cell.nodes] = words[words.index("--kv-transfer-gbs") + 1]
    assert shown == {2: f"{INTER_NODE_GBS:g}", 1: f"{INTRA_NODE_GBS:g}"}


def processes_naming(pattern: str) -> list[str]:
    """Command lines of this host's processes that match ``pattern`` (an extended regular expression)."""
    out = subprocess.run(["pgrep", "-af", "--", pattern], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("program", ["smg", "vllm-router"])
def test_prefill_decode_cell_on_two_nodes_through_the_launcher(slurm2, tmp_path, program):
    """Prefill on node 0 with the router, decode on node 1: each its own step, the KV handoff between
    them across the steps, every check of a disaggregated cell passing, nothing left afterwards."""
    if not engine_sim_ready():
        pytest.skip("the repository's .venv or benchmarks/run_cell.sh is missing")
    cell, runners = make_pd_cell(tmp_path, program)
    assert cell.nodes == 2 and cell.instance_tps == [1, 1]
    result = tmp_path / "result"
    job, seen = _launch_on_two_nodes(slurm2, cell, runners, result)
    _assert_steps_on_both_nodes(job, seen)
    assert (result / "status.txt").read_text().splitlines()[0] == "SUCCESS"
    record = json.loads((result / "cell.json").read_text())
    assert record["status"] == "SUCCESS"
    so = record["scaleout"]
    assert so["mode"] == "pd"
    assert [(r["name"], r["role"], r["node"]) for r in so["replicas"]] == [
        ("p0", "prefill", "gpunode1"),
        ("d0", "decode", "gpunode2"),
    ]
    assert so["placement"]["router_node"] == "gpunode1"
    assert [n["name"] for n in so["placement"]["nodes"]] == ["gpunode1", "gpunode2"]
    _assert_ports_bound_on_their_nodes(job, record)
    decode = so["replicas"][1]["command"]
    assert decode[:5] == ["srun", f"--jobid={job}", "--nodes=1", "--ntasks=1", "--nodelist=gpunode2"]
    assert decode[decode.index("--kv-transfer-gbs") + 1] == f"{INTER_NODE_GBS:g}"
    # The engines took it: the decode models the transfer at the inter-node figure, and the prefill's
    # bootstrap listener is bound to its node's address on the port the router was given.
    assert f"modelled KV transfer {INTER_NODE_GBS:g} GB/s per GPU" in (result / "server.log").read_text()
    address = so["placement"]["nodes"][0]["address"]
    listener = f"bootstrap listener on {address}:{so['replicas'][0]['bootstrap_port']};"
    assert listener in (result / "server.p0.log").read_text()
    summary = json.loads((result / "summary.json").read_text())
    assert summary["counts"]["ok"] > 0
    checks = summary["validity"]["checks"]
    for name in ("request_count_gap", "prompt_token_gap", "cached_token_gap"):
        assert checks[name]["ok"], (name, checks[name])
    router = json.loads((result / "router.json").read_text())
    assert router["mode"] == "pd" and router["program"] == program
    assert router["prefill"] == [so["replicas"][0]["url"]] and router["decode"] == [so["replicas"][1]["url"]]
    assert router["requests_by_prefill"][0] > 0
    assert router["requests_by_decode"][0] >= summary["counts"]["ok"]
    # Nothing outlives the cell: no job, no step, no engine or router process of this run.
    assert slurm2.jobs() == []
    assert slurm2.run("squeue", "-h", "-s", "-o", "%i").stdout.strip() == ""
    assert processes_naming(str(result)) == []
    for r in so["replicas"]:
        assert processes_naming(f"--port {r['url'].rsplit(':', 1)[1]}( |$)") == []


# --- ports chosen where they are bound ------------------------------------------------------------


@pytest.mark.integration
def test_the_port_step_binds_distinct_ports_on_the_address_and_says_where(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "gpunode7")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cell.ports", "127.0.0.3", "5"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["node"] == "gpunode7" and report["step"] == "41.3" and report["address"] == "127.0.0.3"
    assert len(set(report["ports"])) == 5
    for port in report["ports"]:  # each was free on that address, and is again
        with socket.create_server(("127.0.0.3", port)):
            pass
    bad = subprocess.run(
        [sys.executable, "-m", "agentsweep.cell.ports", "192.0.2.1", "1"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("cannot bind a port on 192.0.2.1 on node gpunode7:"), bad.stderr


def test_a_port_step_that_reports_nothing_is_a_clear_error():
    placement = Placement(
        job_id="7", nodes=["gpunode1", "gpunode2"],
        addresses={"gpunode1": "127.0.0.2", "gpunode2": "127.0.0.3"},
        slots=[Slot(0, "gpunode1", "127.0.0.2", 0, 1), Slot(1, "gpunode2", "127.0.0.3", 0, 1)],
        gres_type="h200", node_gpus=1, container_args=[], vendor="none",
    )  # fmt: skip
    calls: list[list[str]] = []

    def run(argv):  # type: ignore[no-untyped-def]
        calls.append(list(argv))
        return "srun: warning: something\n"

    with pytest.raises(RunError, match=r"the port step on gpunode2 did not report its ports"):
        bind_ports(placement, {"gpunode2": 2}, python="PY", environ={}, taken=set(), run=run)
    (argv,) = calls
    assert argv[:6] == ["srun", "--jobid=7", "--nodes=1", "--ntasks=1", "--nodelist=gpunode2", "--overlap"]
    assert argv[-5:] == ["PY", "-m", "agentsweep.cell.ports", "127.0.0.3", "2"]

    def wrong(argv):  # type: ignore[no-untyped-def]
        return json.dumps({"node": "gpunode2", "step": "7.1", "address": "127.0.0.3", "ports": [1]})

    with pytest.raises(RunError, match=r"not 2 ports on 127.0.0.3"):
        bind_ports(placement, {"gpunode2": 2}, python="PY", environ={}, taken=set(), run=wrong)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_cell_whose_lanes_run_on_client_processes_on_both_nodes(slurm2, tmp_path):
    """client_nodes 2: client 0 in the cell's own step on node 0, client 1 as a job step on node 1,
    one start instant, disjoint lanes and traces, one merged requests.jsonl and summary whose request
    count is the engine's, and the client-side checks made per client node."""
    if not engine_sim_ready():
        pytest.skip("the repository's .venv or benchmarks/run_cell.sh is missing")
    cell, runners = make_cell(tmp_path, duration=8)
    cell = cell.replace(client_nodes=2)
    result = tmp_path / "result"
    job, seen = _launch_on_two_nodes(slurm2, cell, runners, result)
    assert (result / "status.txt").read_text().splitlines()[0] == "SUCCESS", (
        result / "status.txt"
    ).read_text()
    clients = [result / "clients" / str(k) for k in range(2)]
    metas = [json.loads((c / "run_meta.json").read_text()) for c in clients]
    assert [m["node"] for m in metas] == ["gpunode1", "gpunode2"]
    starts = [m["t0_unix"] for doc in metas for m in doc["metas"]]
    assert max(starts) - min(starts) < 0.5  # one common start instant
    own = [[json.loads(line) for line in (c / "requests.jsonl").read_text().splitlines()] for c in clients]
    assert {r["user"] for r in own[0]} <= {0, 2} and {r["user"] for r in own[1]} <= {1, 3}
    assert own[0] and own[1]
    assert not {r["trace_id"] for r in own[0]} & {r["trace_id"] for r in own[1]}  # no trace in both
    merged = [json.loads(line) for line in (result / "requests.jsonl").read_text().splitlines()]
    assert len(merged) == len(own[0]) + len(own[1])
    summary = json.loads((result / "summary.json").read_text())
    assert sorted(summary["self_audit"]["clients"]) == ["0", "1"]
    checks = summary["validity"]["checks"]
    assert checks["request_count_gap"]["ok"] and checks["request_count_gap"]["value"] == 0.0
    assert {"client_cpu_share.client1", "dispatch_lag_p99.client1"} <= set(checks)
    assert any(step.startswith(f"{job}.") and node == "gpunode2" for step, node in seen)
    assert slurm2.jobs() == []
