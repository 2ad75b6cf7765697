"""Real Slurm clusters for the launcher tests, each started once per test session.

munged, slurmctld and one slurmd per node run by hand (no systemd) from a temporary directory, on
free ports, with the config templates kept beside this file; they are stopped by pid when the session
ends. `slurm_cluster` has one node; `slurm_cluster2` two (two slurmds on this host, `slurmd -N NAME`,
each with its own port, spool, log and loopback address: NodeAddr 127.0.0.2 and 127.0.0.3), for cells
spanning nodes.
When Slurm is not installed or cannot start here, every test that needs it skips with one line.
Set AGENTSWEEP_REQUIRE_SLURM=1 to turn that skip into a failure (CI on a machine that has Slurm).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import WaitTimeout, free_port, wait_until

HERE = Path(__file__).resolve().parent
NODE = "gpunode1"
NODES2 = ("gpunode1", "gpunode2")
GPU_TYPES = ("h200", "b200", "mi355x")
GPUS_PER_TYPE = 8
# The daemons live in sbin, which a non-login PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "salloc", "srun", "squeue", "scancel", "sinfo")


@dataclass
class SlurmCluster:
    """A running test cluster: `env` points Slurm's client commands at it."""

    root: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check, timeout=60)

    def jobs(self) -> list[str]:
        """Every job Slurm still knows about (any state squeue shows, completing included)."""
        out = self.run("squeue", "-h", "-o", "%i %T").stdout
        return [line for line in out.splitlines() if line.strip()]

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.root / "log" / name
        if not path.exists():
            return f"({path.name} missing)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if "slurmctld" in self.procs:
            self.run("scancel", "--full", "--quiet", "--user", getpass.getuser(), check=False)
        slurmds = [name for name in self.procs if name.startswith("slurmd ")]
        for name in (*slurmds, "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _exe(name: str) -> str:
    return shutil.which(name, path=SEARCH_PATH) or name


NODE_SPEC = (
    "CPUs=64 Sockets=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=1048576"
    " Gres=gpu:h200:8,gpu:b200:8,gpu:mi355x:8 State=UNKNOWN"
)


def node_address(nodes: tuple[str, ...], index: int) -> str:
    """The NodeAddr of node ``index``: 127.0.0.1 alone; in a cluster of several, each node its own
    loopback address (127.0.0.2, 127.0.0.3, ...: Linux answers all of 127/8 on lo), so that what
    binds or dials a node's address is told apart from what uses another's."""
    return "127.0.0.1" if len(nodes) == 1 else f"127.0.0.{2 + index}"


def _write_configs(root: Path, munge_socket: Path, nodes: tuple[str, ...]) -> Path:
    for sub in ("state", "spool", "run", "log", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for kind in GPU_TYPES:
        for i in range(GPUS_PER_TYPE):
            (root / "dev" / f"{kind}-{i}").symlink_to("/dev/null")
    host = socket.gethostname().split(".")[0]
    ports = [free_port() for _ in nodes]
    fields = {
        "host": host,
        "node_lines": "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr={node_address(nodes, i)} Port={port} {NODE_SPEC}"
            for i, (n, port) in enumerate(zip(nodes, ports, strict=True))
        ),
        "nodes": ",".join(nodes),
        "ctld_port": free_port(),
        "slurmd_port": ports[0],
        "user": getpass.getuser(),
        "root": root,
        "munge_socket": munge_socket,
    }
    conf = root / "slurm.conf"
    conf.write_text((HERE / "slurm.conf.in").read_text().format(**fields))
    (root / "gres.conf").write_text((HERE / "gres.conf.in").read_text().format(**fields))
    # An empty plugin stack keeps any site SPANK plugins (pyxis...) out of the test cluster.
    (root / "plugstack.conf").write_text("")
    return conf


def start_cluster(root: Path, nodes: tuple[str, ...] = (NODE,)) -> SlurmCluster:
    """Start munged, slurmctld and a slurmd per node under `root`; raise RuntimeError saying what failed."""
    munge_dir = root / "munge"
    munge_dir.mkdir(parents=True, mode=0o700)
    munge_socket = munge_dir / "munge.socket"
    key = munge_dir / "munge.key"
    subprocess.run([_exe("mungekey"), "--create", "--keyfile", str(key)], check=True, capture_output=True)
    conf = _write_configs(root, munge_socket, nodes)
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": SEARCH_PATH}
    for name in list(env):
        if name.startswith(("SLURM_", "SALLOC_", "SRUN_", "SQUEUE_", "SBATCH_")) and name != "SLURM_CONF":
            del env[name]
    cluster = SlurmCluster(root=root, env=env)
    logs = root / "log"
    try:
        cluster.procs["munged"] = subprocess.Popen(
            [
                _exe("munged"), "--foreground", "--force",
                f"--key-file={key}", f"--socket={munge_socket}",
                f"--pid-file={munge_dir / 'munged.pid'}", f"--log-file={logs / 'munged.log'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
            ],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(munge_socket.exists, timeout=10, interval=0.2, what="munged's socket")
        cluster.procs["slurmctld"] = subprocess.Popen(
            [_exe("slurmctld"), "-D", "-i", "-f", str(conf)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for node in nodes:
            cluster.procs[f"slurmd {node}"] = subprocess.Popen(
                [_exe("slurmd"), "-D", "-N", node, "-f", str(conf)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip

        def nodes_idle() -> bool:
            for name, proc in cluster.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}")
            out = cluster.run("sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T", check=False).stdout
            idle = {line.split()[0] for line in out.splitlines() if line.split()[1:2] == ["idle"]}
            return idle == set(nodes)

        wait_until(nodes_idle, timeout=30, interval=0.2, what=f"nodes {', '.join(nodes)} to be idle")
    except (RuntimeError, WaitTimeout, OSError, subprocess.CalledProcessError) as err:
        logs = ("slurmctld.log", *(f"slurmd-{n}.log" for n in nodes))
        tails = "; ".join(f"{n}: {cluster.log_tail(n, 3)!r}" for n in logs)
        cluster.stop()
        raise RuntimeError(f"{err} ({tails})") from err
    return cluster


def _session_cluster(
    tmp_path_factory: pytest.TempPathFactory, nodes: tuple[str, ...]
) -> Iterator[SlurmCluster]:
    required = os.environ.get("AGENTSWEEP_REQUIRE_SLURM") == "1"

    def unavailable(why: str) -> None:
        line = f"real Slurm unavailable: {why}"
        if required:
            pytest.fail(line + " (AGENTSWEEP_REQUIRE_SLURM=1)", pytrace=False)
        pytest.skip(line)

    missing = [d for d in DAEMONS if shutil.which(d, path=SEARCH_PATH) is None]
    if missing:
        unavailable(f"{', '.join(missing)} not found (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        unavailable("slurmd must run as root to start job steps")
    try:
        cluster = start_cluster(tmp_path_factory.mktemp(f"slurm{len(nodes)}n", numbered=True), nodes)
    except RuntimeError as err:
        unavailable(f"could not start the test cluster: {err}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The session's one-node Slurm cluster, or a one-line skip when this machine cannot run one."""
    yield from _session_cluster(tmp_path_factory, (NODE,))


@pytest.fixture(scope="session")
def slurm_cluster2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A two-node cluster (two slurmds on this host), started only by the tests that need it."""
    yield from _session_cluster(tmp_path_factory, NODES2)


RUNNER_KINDS = {"h200": "nvidia", "b200": "nvidia", "mi355x": "amd"}


def write_runners(path: Path, runtime: str = "none", gpus_per_node: int = GPUS_PER_TYPE) -> Path:
    """A runners file for the test cluster: one runner per GPU type, its partition named alike."""
    lines = [
        f"{key}: {{runs_on: [self-hosted, slurm, {key}], launcher: runners/launch_{key}.sh,"
        f" gpus_per_node: {gpus_per_node}, gres_type: {key}, cpu_dram_gb: 64, partition: {key},"
        f" account: null, time_limit_min: 30, exclude: [], container_runtime: {runtime}, hf_cache: null}}"
        for key in RUNNER_KINDS
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _emptied(cluster: SlurmCluster) -> SlurmCluster:
    if cluster.jobs():
        cluster.run("scancel", "--full", "--user", getpass.getuser(), check=False)
        wait_until(lambda: not cluster.jobs(), timeout=30, interval=0.2, what="leftover jobs to go")
    return cluster


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The cluster, emptied of jobs left by an earlier test (no allocation may outlive its launcher)."""
    return _emptied(slurm_cluster)


@pytest.fixture
def slurm2(slurm_cluster2: SlurmCluster) -> SlurmCluster:
    """The two-node cluster, emptied of jobs left by an earlier test."""
    return _emptied(slurm_cluster2)


@pytest.fixture
def make_runners() -> Callable[..., Path]:
    return write_runners


SWEEP_TEMPLATE = """\
{key}:
  runner: {runner}
  engine: sim
  model: meta-llama/Llama-3.3-70B-Instruct
  precision: fp8
  image: "{image}"
  duration: {duration}
  speed: 50
  traces: kv-cache-tester/sample_traces
  replay: {{max_context: 131072, warmup_requests: 0}}
  engine_args: --hardware {runner} --num-gpu-blocks-override 4096
  search_space:
    tp{tp}: {{users: {users}, offload: [{offload}]}}
"""


@pytest.fixture
def cell_env(tmp_path: Path) -> Callable[..., dict[str, str]]:
    """Build one cell's launcher environment through the real matrix generator (agentsweep.config)."""
    from agentsweep.config import load_runners, select_cells

    def build(
        runner: str,
        runners_path: Path,
        *,
        tp: int = 2,
        users: int = 2,
        offload: str = "off",
        duration: int = 4,
        image: str = "",
        base_env: dict[str, str] | None = None,
    ) -> dict[str, str]:
        key = f"t-{runner}"
        sweep = tmp_path / f"sweep-{runner}-{tp}-{offload}.yaml"
        sweep.write_text(
            SWEEP_TEMPLATE.format(
                key=key, runner=runner, image=image, duration=duration, tp=tp, users=users, offload=offload
            )
        )
        (cell,) = select_cells(sweep, [key], runners=load_runners(runners_path))
        env = {**(base_env or os.environ), "AGENTSWEEP_CELL": cell.to_json()}
        env["RESULT_DIR"] = str(tmp_path / "results" / cell.exp_name)
        env["AGENTSWEEP_RUNNERS"] = str(runners_path)
        return env

    return build
