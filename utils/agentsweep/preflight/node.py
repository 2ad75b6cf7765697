"""The checks that must run on a GPU node itself: its GPUs, its memory, its ports, its container runtime.

``python -m agentsweep.preflight.node --spec JSON`` runs them where it is started (preflight starts it
on every node of a short Slurm job, one task per node) and prints one JSON object: the node's name
and its checks. Stdlib only, so any Python on the node runs it.

The spec (``NodeSpec``) says what the cells of the key need on one node: the vendor and hardware
whose GPUs the runner claims and how many, the host memory of the offload budget (GiB, 0 = none),
the fixed ports, the container runtime, and whether the engine is simulated (no GPU, no real
offload memory).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentsweep.preflight.report import Check, failed, passed, skipped

# Product-name fragment nvidia-smi / amd-smi show for each hardware the runners name (a whole word
# at its start: "B200" is no match for "NVIDIA GB200").
GPU_NAMES = {
    "h200": "H200", "b200": "B200", "b300": "B300", "gb200": "GB200", "gb300": "GB300",
    "mi325x": "MI325", "mi355x": "MI355",
}  # fmt: skip
_NVIDIA_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")
_AMD_GPU_LINE = re.compile(r"^GPU:\s*(\d+)\s*$")

Run = Callable[[Sequence[str]], tuple[int, str]]


@dataclass(frozen=True)
class NodeSpec:
    """What the cells need on one node (see the module docstring)."""

    runner: str
    vendor: str  # nvidia | amd
    hardware: str  # a key of agentsweep.contract.hardware.HARDWARE, or "" (unknown)
    gpus: int  # GPUs the runner claims per node
    mem_gb: int  # host memory the offload cells ask Slurm for, per node (0 = none)
    ports: list[int] = field(default_factory=list)
    runtime: str = "none"  # pyxis | docker | none
    simulated: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> NodeSpec:
        return cls(**json.loads(text))


def _run(argv: Sequence[str]) -> tuple[int, str]:
    """(exit status, stdout + stderr); 127 when the program is not installed."""
    if shutil.which(argv[0]) is None:
        return 127, f"{argv[0]}: not found"
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return 126, str(err)
    return proc.returncode, proc.stdout + proc.stderr


def parse_nvidia_smi_list(text: str) -> list[tuple[int, str, str]]:
    """(index, product name, UUID) of every GPU in ``nvidia-smi -L`` output (MIG lines skipped)."""
    out = []
    for line in text.splitlines():
        m = _NVIDIA_LINE.match(line.strip())
        if m:
            out.append((int(m.group(1)), m.group(2), m.group(3)))
    return out


def parse_amd_smi_list(text: str) -> list[int]:
    """The GPU indices of ``amd-smi list`` output (one ``GPU: N`` block per GPU)."""
    return [int(m.group(1)) for line in text.splitlines() if (m := _AMD_GPU_LINE.match(line.strip()))]


def check_gpus(spec: NodeSpec, node: str, run: Run = _run) -> Check:
    """The node shows at least the GPUs the runner claims, of the claimed kind (NVIDIA: by name)."""
    name = "node.gpus"
    if spec.simulated:
        return skipped(name, "the simulated engine uses no GPU", node)
    where = f"runner {spec.runner} in configs/runners.yaml"
    if spec.vendor == "amd":
        status, text = run(["amd-smi", "list"])
        if status != 0:
            return failed(
                name,
                f"`amd-smi list` failed ({_last(text)})",
                f"install ROCm's amd-smi on the node or fix {where}",
                node,
            )
        count = len(parse_amd_smi_list(text))
        if count < spec.gpus:
            return failed(
                name,
                f"amd-smi lists {count} GPUs, runner claims {spec.gpus}",
                f"set gpus_per_node of {where}, or exclude this node",
                node,
            )
        return passed(
            name,
            f"amd-smi lists {count} GPUs (runner claims {spec.gpus}; names are not in `amd-smi list`)",
            node,
        )
    status, text = run(["nvidia-smi", "-L"])
    if status != 0:
        return failed(
            name,
            f"`nvidia-smi -L` failed ({_last(text)})",
            f"install the NVIDIA driver on the node or fix {where}",
            node,
        )
    gpus = parse_nvidia_smi_list(text)
    want = GPU_NAMES.get(spec.hardware, "")
    kinds = sorted({g[1] for g in gpus})
    matching = [g for g in gpus if re.search(rf"\b{want}", g[1])] if want else gpus
    if len(matching) < spec.gpus:
        shown = f"{len(gpus)} GPUs ({', '.join(kinds) or 'none'})"
        kind = f" {want}" if want else ""
        return failed(
            name,
            f"nvidia-smi -L shows {shown}; runner {spec.runner} claims {spec.gpus}{kind}",
            f"point runner {spec.runner} at nodes with {spec.gpus}{kind} GPUs (partition, gres_type) or fix its gpus_per_node/hardware",
            node,
        )
    return passed(name, f"nvidia-smi -L shows {len(gpus)} GPUs: {', '.join(kinds)}", node)


def mem_available_gib(meminfo: str) -> float | None:
    """MemAvailable of /proc/meminfo text, GiB."""
    m = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE)
    return int(m.group(1)) / 2**20 if m else None


def check_memory(spec: NodeSpec, node: str, meminfo: str | None = None) -> Check:
    """Host memory available now covers the offload cells' ask (cpu_dram_gb share + overhead)."""
    name = "node.memory"
    if spec.mem_gb <= 0:
        return skipped(name, "no cell of this key offloads KV to host memory", node)
    if spec.simulated:
        return skipped(
            name, f"the simulated engine's CPU tier holds no real KV (cells ask {spec.mem_gb} GiB)", node
        )
    text = meminfo if meminfo is not None else Path("/proc/meminfo").read_text(encoding="ascii")
    have = mem_available_gib(text)
    if have is None:
        return failed(name, "no MemAvailable in /proc/meminfo", "run preflight on a Linux node", node)
    if have < spec.mem_gb:
        return failed(
            name,
            f"{have:.0f} GiB available, the offload cells ask {spec.mem_gb} GiB",
            f"lower cpu_dram_gb of runner {spec.runner} in configs/runners.yaml (the ask is cpu_dram_gb + overhead)",
            node,
        )
    return passed(name, f"{have:.0f} GiB available, the offload cells ask {spec.mem_gb} GiB", node)


def port_free(port: int, host: str = "0.0.0.0") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(spec: NodeSpec, node: str) -> Check:
    """Every fixed port of the cells can be bound on the node (the rest are picked free at start)."""
    name = "node.ports"
    if not spec.ports:
        return passed(name, "no fixed ports: the cell picks free ports when it starts", node)
    busy = [p for p in spec.ports if not port_free(p)]
    if busy:
        listed = ", ".join(map(str, busy))
        return failed(
            name,
            f"port {listed} in use",
            f"stop what listens on {listed} there, or leave the port to the cell (unset PORT; drop fixed ports from engine_args/engine_env)",
            node,
        )
    return passed(name, f"ports {', '.join(map(str, spec.ports))} free", node)


def check_runtime(spec: NodeSpec, node: str, run: Run = _run) -> Check:
    """The container runtime the launcher uses on the node answers."""
    name = "node.container"
    if spec.runtime == "none":
        return skipped(name, f"runner {spec.runner} runs cells without a container", node)
    argv = (
        ["enroot", "version"]
        if spec.runtime == "pyxis"
        else ["docker", "version", "--format", "{{.Server.Version}}"]
    )
    status, text = run(argv)
    if status != 0:
        return failed(
            name,
            f"`{' '.join(argv[:2])}` failed ({_last(text)})",
            f"install {argv[0]} on the node, or set container_runtime of runner {spec.runner}",
            node,
        )
    return passed(name, f"{argv[0]} {_last(text)}", node)


def node_checks(spec: NodeSpec, node: str | None = None, run: Run = _run) -> list[Check]:
    here = node or socket.gethostname().split(".")[0]
    return [
        check_gpus(spec, here, run),
        check_memory(spec, here),
        check_ports(spec, here),
        check_runtime(spec, here, run),
    ]


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentsweep.preflight.node", description=__doc__)
    parser.add_argument("--spec", required=True, help="NodeSpec as JSON")
    parser.add_argument(
        "--node", default="", help="name to report (default: $SLURMD_NODENAME, else the host name)"
    )
    args = parser.parse_args(argv)
    import os

    node = args.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    try:
        spec = NodeSpec.from_json(args.spec)
    except (ValueError, TypeError) as err:
        print(f"input error: --spec: {err}", file=sys.stderr)
        return 2
    checks = node_checks(spec, node)
    print(json.dumps({"node": node, "checks": [c.to_dict() for c in checks]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
