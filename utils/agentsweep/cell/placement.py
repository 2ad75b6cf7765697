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
"""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError, RunError

# The launcher's container flags for each engine step (shell words), e.g. pyxis's --container-image.
CONTAINER_ARGS_VAR = "AS_STEP_CONTAINER_ARGS"

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
    """The instances of one multi-node cell on the nodes of its allocation (node 0 runs the cell)."""

    job_id: str
    nodes: list[str]
    addresses: dict[str, str]
    slots: list[Slot]
    gres_type: str
    node_gpus: int
    container_args: list[str]
    vendor: str  # nvidia | amd | none (the simulated engine: no GPUs to select)

    def step_prefix(self, index: int) -> list[str]:
        """The srun words that start instance ``index`` as its own step on its node."""
        slot = self.slots[index]
        return self._prefix(slot.node, slot.gpu_offset, slot.tp)

    def node_step_prefix(self, node: str, gpus: int) -> list[str]:
        """The srun words of a step on ``node`` that keeps the cell's ``gpus`` GPUs there (positions
        0.. of the node's share: instances are packed from the first), for tools that read them."""
        return self._prefix(node, 0, gpus)

    def _prefix(self, node: str, gpu_offset: int, tp: int) -> list[str]:
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
        words += [*self.container_args, "--export=ALL"]
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
        return words

    def wrap(self, index: int, argv: Sequence[str]) -> list[str]:
        return [*self.step_prefix(index), *argv]

    def to_record(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "nodes": [{"name": n, "address": self.addresses[n]} for n in self.nodes],
            "router_node": self.nodes[0],
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
) -> Placement | None:
    """The placement of a multi-node cell inside its allocation; None when the cell runs here alone.

    None for a one-node cell, and for any cell outside a Slurm job (no SLURM_JOB_ID): it then runs
    on this host as a one-node cell would. An allocation with fewer nodes than the cell spans is
    refused.
    """
    job_id = environ.get("SLURM_JOB_ID", "").strip()
    if cell.nodes <= 1 or not job_id:
        return None
    nodes = job_nodes(job_id, run)
    here = local_node(environ)
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
    return Placement(
        job_id=job_id,
        nodes=nodes,
        addresses=addresses,
        slots=slots,
        gres_type=gres_type,
        node_gpus=node_gpus(tps, gpus_per_node),
        container_args=shlex.split(environ.get(CONTAINER_ARGS_VAR, "")),
        vendor=vendor,
    )


def from_environ(cell: Cell, environ: Mapping[str, str]) -> Placement | None:
    """``plan_placement`` with the runner's facts the cell carries (its node size and GRES type)."""
    if cell.nodes <= 1 or not environ.get("SLURM_JOB_ID", "").strip():
        return None
    from agentsweep.cell.engines import recipe

    if recipe(cell.engine).simulated:
        vendor = "none"
    else:
        vendor = "amd" if cell.hardware == "mi355x" else "nvidia"
    return plan_placement(
        cell, gpus_per_node=cell.gpus_per_node, gres_type=cell.gres_type, vendor=vendor, environ=environ
    )
