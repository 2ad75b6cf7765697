"""Where each engine instance of a multi-node cell runs inside its Slurm allocation, and how it starts.

A cell whose instances span several nodes (``cell.nodes`` > 1) runs as step 0 of its allocation on
the first node (node 0); the router, the scrapers and the replayer stay in that process. Each engine
instance is packed onto the allocation's nodes in ``cell.instance_tps`` order, as the matrix does
(a new node whenever an instance does not fit the GPUs left on the current one), and starts as its
own job step there::

    srun --jobid=JOB --nodes=1 --ntasks=1 --nodelist=NODE --overlap --kill-on-bad-exit=1
         [--gres=gpu:TYPE:N] [container flags] --export=ALL [GPU selector] ENGINE ARGV...

``--overlap``: the cell's own step already holds node 0's CPUs, memory and GPUs, so a step without it
would wait for them forever. Overlapping steps share GRES too, and Slurm then hands every step on a
node the same first GPUs (two ``--gres=gpu:h200:1`` steps on one node both see
``CUDA_VISIBLE_DEVICES=0``). So each step asks for the node's whole share of the job's GPUs and a
small selector inside the step keeps the instance's positions of that list, as ``device_slices``
does for a one-node cell. The engine binds the node's address (its ``NodeAddr``), which the router
on node 0 reaches. Terminating an instance's ``srun`` cancels its step: Slurm kills the processes
on the node at once.

Ports are chosen where they are bound: before the instances start, the cell runs
``python -m agentsweep.cell.ports ADDRESS COUNT`` as a short step on every other node, which binds the
ports that node's instances need on its address and reports them back with the node and step it ran
as (``BoundPorts``, kept in cell.json); node 0's are bound by the cell itself.

A routed or multi-node cell whose runner uses a container (pyxis, docker) runs on the host side of
node 0, outside the container (``cell_on_host``): the router, the scrapers and the replayer use the
runner's interpreter (which has the routers), and ``srun``/``scontrol`` are at hand. Only the engine
instances run in the image, each as its own step, one-node cells included: pyxis with the launcher's
container flags (``AS_STEP_CONTAINER_ARGS``), docker through ``docker run`` inside the step, named and
labelled for this job so that what outlives its step can be removed by label.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentsweep.cell.ports import bind_free_ports
from agentsweep.contract.cell import Cell
from agentsweep.contract.hardware import is_amd
from agentsweep.errors import InputError, RunError

# The launcher's container flags for each engine step (shell words), e.g. pyxis's --container-image.
CONTAINER_ARGS_VAR = "AS_STEP_CONTAINER_ARGS"
# docker: the `docker run` options of each engine instance (shell words: network, devices, mounts).
DOCKER_ARGS_VAR = "AS_DOCKER_RUN_ARGS"
# "1" when the launcher runs the cell on the host side of its node (``cell_on_host``).
CELL_ON_HOST_VAR = "AS_CELL_ON_HOST"
# The label every instance container of a job carries (value: the job id): what cleanup removes.
DOCKER_JOB_LABEL = "agentsweep.job"
# The instance's container name, in its step's environment, for the task epilog (runners/lib).
DOCKER_NAME_VAR = "AS_DOCKER_CONTAINER"
DOCKER_EPILOG = "runners/lib/docker_epilog.sh"
# What an engine instance's container gets of the step's environment besides the engine's own
# variables (docker passes variables by name only): the hub's token and cache, the GPU selection.
CONTAINER_PASS_NAMES = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
)
# The host's interpreter settings, which would point the image's Python at the host's (pyxis passes
# the step's environment into the container).
HOST_ONLY_NAMES = ("VIRTUAL_ENV", "PYTHONPATH", "AGENTSWEEP_PYTHON")

Run = Callable[[Sequence[str]], str]

# Keeps positions OFFSET..OFFSET+TP-1 of the GPU list Slurm gave the step, in the variable the vendor's
# runtime reads (ROCm: the list in ROCR_VISIBLE_DEVICES, the instance's indices in HIP_VISIBLE_DEVICES).
_SELECT_GPUS = r"""
off=$1 tp=$2 vendor=$3
shift 3
if [[ $vendor == amd ]]; then
  list=${ROCR_VISIBLE_DEVICES:-${CUDA_VISIBLE_DEVICES:-}}
else
  list=${CUDA_VISIBLE_DEVICES:-}
fi
IFS=, read -r -a ids <<<"$list"
if ((${#ids[@]} < off + tp)); then
  echo "gpu selector on $(hostname): the step shows GPUs '$list' but this instance needs positions $off..$((off + tp - 1))" >&2
  exit 2
fi
unset ZE_AFFINITY_MASK
if [[ $vendor == amd ]]; then
  export ROCR_VISIBLE_DEVICES=$list
  HIP_VISIBLE_DEVICES=$(seq -s, "$off" $((off + tp - 1)))
  export HIP_VISIBLE_DEVICES
  unset CUDA_VISIBLE_DEVICES GPU_DEVICE_ORDINAL
else
  CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${ids[*]:off:tp}")
  export CUDA_VISIBLE_DEVICES
  unset ROCR_VISIBLE_DEVICES
fi
exec "$@"
"""


def pack(instance_tps: Sequence[int], gpus_per_node: int) -> list[tuple[int, int]]:
    """(node index, first GPU position on that node) of every instance, packed as the matrix does."""
    out: list[tuple[int, int]] = []
    node, used = -1, gpus_per_node
    for tp in instance_tps:
        if tp > gpus_per_node - used:
            node, used = node + 1, 0
        out.append((node, used))
        used += tp
    return out


def node_gpus(instance_tps: Sequence[int], gpus_per_node: int) -> int:
    """GPUs the fullest node holds: what a multi-node allocation asks for on every node."""
    per_node: dict[int, int] = {}
    for (node, _), tp in zip(pack(instance_tps, gpus_per_node), instance_tps, strict=True):
        per_node[node] = per_node.get(node, 0) + tp
    return max(per_node.values(), default=0)


def free_port(host: str = "127.0.0.1", taken: set[int] | None = None) -> int:
    """A port of ``host`` free now; with ``taken``, also none of those (and it is added to them)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if taken is None:
            return port
        if port not in taken:
            taken.add(port)
            return port


def local_node(environ: Mapping[str, str]) -> str:
    """This process's node: Slurm's name for it inside a job, else the host name."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def cell_on_host(cell: Cell, runtime: str) -> bool:
    """Whether the cell runs on the host side of its node while its engines run in the container.

    True for a routed or multi-node cell under a container runtime: the router and the Slurm client
    are on the host, not in the engine's image. A single engine keeps running beside the cell in
    the container, as it always has.
    """
    return runtime in ("pyxis", "docker") and (cell.routed or cell.nodes > 1)


@dataclass(frozen=True)
class BoundPorts:
    """Ports found free on one node by a process that bound them there (what cell.json shows)."""

    node: str  # the node, as the placement names it
    address: str  # the address they were bound on (the one the node's instances bind)
    ports: list[int]
    bound_on: str  # the node the binding process says it ran on
    step: str = ""  # the Slurm step it ran as (JOB.STEP); "" for the cell itself

    def to_record(self) -> dict[str, Any]:
        return {"ports": self.ports, "bound_on": self.bound_on, "bound_by_step": self.step}


@dataclass(frozen=True)
class Slot:
    """One engine instance: its node, the address it binds and is reached at, its GPUs there."""

    index: int
    node: str
    address: str
    gpu_offset: int
    tp: int


@dataclass(frozen=True)
class Placement:
    """The engine instances of one cell on the nodes of its allocation, each started as its own job step
    (node 0 runs the cell)."""

    job_id: str
    nodes: list[str]
    addresses: dict[str, str]
    slots: list[Slot]
    gres_type: str
    node_gpus: int
    container_args: list[str]
    vendor: str  # nvidia | amd | none (the simulated engine: no GPUs to select)
    runtime: str = "none"  # none | pyxis | docker: where each instance's engine runs
    docker_args: list[str] = field(default_factory=list)  # docker: `docker run` options
    image: str = ""  # docker: the image each instance runs
    name_prefix: str = "agentsweep"  # docker: instance k's container is NAME_PREFIX-k
    docker_epilog: str = ""  # docker: the task epilog that removes a stopped step's container
    bound: dict[str, BoundPorts] = field(default_factory=dict)  # node -> its ports, once bound

    def step_prefix(self, index: int, env_names: Sequence[str] = ()) -> list[str]:
        """The words that start instance ``index`` as its own step on its node (then its argv).

        ``env_names``: the engine's own variables, which a docker container gets by name.
        """
        slot = self.slots[index]
        return self._prefix(slot.node, slot.gpu_offset, slot.tp, index, env_names)

    def node_step_prefix(self, node: str, gpus: int) -> list[str]:
        """The srun words of a step on ``node`` that keeps the cell's ``gpus`` GPUs there (positions
        0.. of the node's share: instances are packed from the first), for tools that read them. Under
        docker the tool runs on the host side of the node, not in an engine's container."""
        return self._prefix(node, 0, gpus, None, ())

    def client_step_prefix(self, node: str) -> list[str]:
        """The srun words of a client process (the replayer) on ``node``: no GPUs, no container (it
        runs on the host side, with the cell's interpreter)."""
        return [
            "srun",
            f"--jobid={self.job_id}",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            "--overlap",
            "--kill-on-bad-exit=1",
            "--export=ALL",
        ]

    def _prefix(
        self, node: str, gpu_offset: int, tp: int, index: int | None, env_names: Sequence[str]
    ) -> list[str]:
        """``index``: the engine instance the step runs (``None``: a tool step, never a container)."""
        docker = self.runtime == "docker" and index is not None
        words = [
            "srun",
            f"--jobid={self.job_id}",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            "--overlap",
            "--kill-on-bad-exit=1",
        ]
        if self.gres_type:
            words.append(f"--gres=gpu:{self.gres_type}:{self.node_gpus}")
        words += self.container_args
        if docker:  # a stopped step kills the client at once: the epilog removes it
            assert index is not None
            name = self.container_name(index)
            words += [f"--task-epilog={self.docker_epilog}", f"--export=ALL,{DOCKER_NAME_VAR}={name}"]
        else:
            words.append("--export=ALL")
        if self.runtime == "pyxis":  # the step's environment enters the image: not the host's Python
            words = ["env", *(w for name in HOST_ONLY_NAMES for w in ("-u", name)), *words]
        if self.vendor != "none":
            words += [
                "bash",
                "-c",
                _SELECT_GPUS,
                "select-gpus",
                str(gpu_offset),
                str(tp),
                self.vendor,
            ]
        if docker:
            assert index is not None
            words += self.docker_run(index, env_names)
        return words

    def docker_run(self, index: int, env_names: Sequence[str] = ()) -> list[str]:
        """``docker run ... IMAGE`` of instance ``index``: removed when it exits, named and labelled for
        this job; the engine's variables and ``CONTAINER_PASS_NAMES`` go in by name."""
        names = sorted({*env_names, *CONTAINER_PASS_NAMES})
        return [
            "docker", "run", "--rm",
            "--name", self.container_name(index),
            "--label", f"{DOCKER_JOB_LABEL}={self.job_id}",
            *self.docker_args,
            *(w for name in names for w in ("--env", name)),
            self.image,
        ]  # fmt: skip

    def container_name(self, index: int) -> str:
        return f"{self.name_prefix}-{index}"

    def wrap(self, index: int, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        return [*self.step_prefix(index, sorted(env or {})), *argv]

    def to_record(self) -> dict[str, Any]:
        nodes = []
        for n in self.nodes:
            item: dict[str, Any] = {"name": n, "address": self.addresses[n]}
            if n in self.bound:
                item.update(self.bound[n].to_record())
            nodes.append(item)
        return {
            "job_id": self.job_id,
            "nodes": nodes,
            "router_node": self.nodes[0],
            "runtime": self.runtime,
        }


def _run(argv: Sequence[str]) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RunError(f"placement: `{shlex.join(argv)}` failed: {err}") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunError(f"placement: `{shlex.join(argv)}` exited with {proc.returncode}: {why}")
    return proc.stdout


def _field(text: str, name: str) -> str:
    match = re.search(rf"(?:^|\s){name}=(\S*)", text)
    return match.group(1) if match else ""


def job_nodes(job_id: str, run: Run = _run) -> list[str]:
    """The allocation's nodes, in Slurm's order (from the job record, not a step's environment)."""
    nodelist = _field(run(["scontrol", "show", "job", "--oneliner", job_id]), "NodeList")
    if not nodelist or nodelist == "(null)":
        raise RunError(f"placement: job {job_id} has no nodes (scontrol show job: NodeList={nodelist})")
    return [n for n in run(["scontrol", "show", "hostnames", nodelist]).split() if n]


def node_address(node: str, run: Run = _run) -> str:
    """The address other nodes reach ``node`` at: its NodeAddr, else its host name, else its name."""
    text = run(["scontrol", "show", "node", "--oneliner", node])
    for name in ("NodeAddr", "NodeHostName"):
        value = _field(text, name)
        if value and value != "(null)":
            return value
    return node


def plan_placement(
    cell: Cell,
    *,
    gpus_per_node: int,
    gres_type: str,
    vendor: str,
    environ: Mapping[str, str],
    run: Run = _run,
    runtime: str = "none",
) -> Placement | None:
    """The placement of a cell's instances inside its allocation; None when the cell runs them here.

    A multi-node cell is placed on its allocation's nodes, node 0 first. A one-node cell is placed only
    when it runs on the host side of its node (``runtime`` is its container runtime, see
    ``cell_on_host``): its instances then reach each other on loopback, as without a placement. None
    for any other cell, and for any cell outside a Slurm job (no SLURM_JOB_ID): it then runs on this
    host as a one-node cell would. An allocation with fewer nodes than the cell spans is refused.
    """
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    on_host = cell_on_host(cell, runtime)
    if not job_id or (cell.nodes <= 1 and not on_host):
        return None
    here = local_node(environ)
    if cell.nodes <= 1:
        nodes, addresses = [here], {here: "127.0.0.1"}
    else:
        nodes = job_nodes(job_id, run)
        if here in nodes:  # node 0 is where the cell (and so the router and replayer) runs
            nodes.remove(here)
            nodes.insert(0, here)
        if len(nodes) < cell.nodes:
            raise InputError(
                f"cell {cell.exp_name} spans {cell.nodes} nodes but job {job_id} has {len(nodes)} "
                f"({', '.join(nodes)}); ask for --nodes={cell.nodes}"
            )
        nodes = nodes[: cell.nodes]
        addresses = {n: node_address(n, run) for n in nodes}
    tps = cell.instance_tps
    slots = [
        Slot(i, nodes[node], addresses[nodes[node]], offset, tp)
        for i, ((node, offset), tp) in enumerate(zip(pack(tps, gpus_per_node), tps, strict=True))
    ]
    container_args: list[str] = []
    docker_args: list[str] = []
    if on_host:
        container_args = shlex.split(environ.get(CONTAINER_ARGS_VAR, "")) if runtime == "pyxis" else []
        docker_args = shlex.split(environ.get(DOCKER_ARGS_VAR, "")) if runtime == "docker" else []
        if runtime == "pyxis" and not container_args:
            raise InputError(
                f"cell {cell.exp_name}: its engines run in pyxis containers but ${CONTAINER_ARGS_VAR} "
                "is empty (the launcher sets it)"
            )
        if runtime == "docker" and not cell.image:
            raise InputError(f"cell {cell.exp_name}: its engines run in docker but the cell has no image")
        if runtime == "docker" and not environ.get("AS_REPO"):
            raise InputError(
                f"cell {cell.exp_name}: its engines run in docker but $AS_REPO (the checkout the "
                f"nodes see, for {DOCKER_EPILOG}) is not set (the launcher sets it)"
            )
    return Placement(
        job_id=job_id,
        nodes=nodes,
        addresses=addresses,
        slots=slots,
        gres_type=gres_type,
        node_gpus=node_gpus(tps, gpus_per_node),
        container_args=container_args,
        vendor=vendor,
        runtime=runtime if on_host else "none",
        docker_args=docker_args,
        image=cell.image,
        name_prefix=re.sub(r"[^A-Za-z0-9_.-]", "_", f"agentsweep-{cell.exp_name}-{job_id}"),
        docker_epilog=f"{environ.get('AS_REPO', '').rstrip('/')}/{DOCKER_EPILOG}"
        if runtime == "docker"
        else "",
    )


def from_environ(cell: Cell, environ: Mapping[str, str]) -> Placement | None:
    """``plan_placement`` with the runner's facts the cell carries (its node size and GRES type) and
    the launcher's container settings (``AS_CONTAINER_RUNTIME``, when it runs the cell on the host)."""
    if not environ.get("SLURM_JOB_ID", "").strip():
        return None
    runtime = environ.get("AS_CONTAINER_RUNTIME", "none") if environ.get(CELL_ON_HOST_VAR) == "1" else "none"
    if cell.nodes <= 1 and not cell_on_host(cell, runtime):
        return None
    from agentsweep.cell.engines import recipe

    if recipe(cell.engine).simulated:
        vendor = "none"
    else:
        vendor = "amd" if is_amd(cell.node.hardware) else "nvidia"
    return plan_placement(
        cell,
        gpus_per_node=cell.node.gpus_per_node,
        gres_type=cell.node.gres_type,
        vendor=vendor,
        environ=environ,
        runtime=runtime,
    )


def bind_ports(
    placement: Placement,
    counts: Mapping[str, int],
    *,
    python: str,
    environ: Mapping[str, str],
    taken: set[int],
    run: Run = _run,
) -> Placement:
    """The placement with ``counts[node]`` ports bound on each node, where its instances will bind them.

    Node 0's are bound here (none of ``taken``, to which they are added: the cell's own port and
    the router's live on this node too); every other node's by ``python -m agentsweep.cell.ports`` as
    a short step there, which reports the node and step it ran as.
    """
    bound: dict[str, BoundPorts] = {}
    for i, node in enumerate(placement.nodes):
        count = counts.get(node, 0)
        if count <= 0:
            continue
        address = placement.addresses[node]
        if i == 0:
            ports = bind_free_ports(address, count, taken)
            taken.update(ports)
            job, step = environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_STEP_ID", "")
            here = BoundPorts(node, address, ports, local_node(environ), f"{job}.{step}" if step else "")
            bound[node] = here
            continue
        argv = [
            "srun", f"--jobid={placement.job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            "--overlap", "--export=ALL", python, "-m", "agentsweep.cell.ports", address, str(count),
        ]  # fmt: skip
        bound[node] = _read_bound(node, address, count, run(argv))
    return dataclasses.replace(placement, bound=bound)


def _read_bound(node: str, address: str, count: int, text: str) -> BoundPorts:
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("{")]
    try:
        data = json.loads(lines[-1])
        ports = [int(p) for p in data["ports"]]
        bound = BoundPorts(node, str(data["address"]), ports, str(data["node"]), str(data["step"]))
    except (IndexError, KeyError, TypeError, ValueError):
        raise RunError(
            f"placement: the port step on {node} did not report its ports: {text.strip()[-200:]!r}"
        ) from None
    if len(ports) != count or bound.address != address:
        raise RunError(f"placement: the port step on {node} reported {data}, not {count} ports on {address}")
    return bound
