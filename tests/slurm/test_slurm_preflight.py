"""`agentsweep preflight` against the real one- and two-node test clusters (see conftest.py).

Each failure the issue names is a run of the real command against the real cluster: an unknown
partition, a wrong GRES type, too few nodes, a port in use on the nodes (checked by the short probe
job on every node), pyxis missing from srun.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import NODE, NODES2, SlurmCluster

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
AGENTSWEEP = str(Path(sys.executable).parent / "agentsweep")

SWEEP = """\
pf:
  runner: h200
  engine: sim
  model: meta-llama/Llama-3.3-70B-Instruct
  precision: fp8
  image: ""
  duration: 30
  speed: 50
  traces: kv-cache-tester/sample_traces
  engine_args: --hardware h200
  router_program: smg
  search_space:
    tp{tp}: {{users: 2, offload: [off], replicas: {replicas}, router: [round_robin]}}
"""


def write(
    tmp: Path, *, tp: int = 1, replicas: int = 2, max_nodes: int = 2, gpus_per_node: int = 8, **runner: str
) -> list[str]:
    fields = {
        "partition": "h200",
        "gres_type": "h200",
        "container_runtime": "none",
        **runner,
    }
    (tmp / "runners.yaml").write_text(
        "h200: {runs_on: [self-hosted, slurm, h200], launcher: runners/launch_h200.sh,"
        f" gpus_per_node: {gpus_per_node}, max_nodes: {max_nodes}, gres_type: {fields['gres_type']},"
        f" hardware: h200, cpu_dram_gb: 64, partition: {fields['partition']}, account: null,"
        f" time_limit_min: 30, exclude: [], container_runtime: {fields['container_runtime']}, hf_cache: null}}\n"
    )
    (tmp / "sweep.yaml").write_text(SWEEP.format(tp=tp, replicas=replicas))
    return ["--key", "pf", "--config", str(tmp / "sweep.yaml"), "--runners", str(tmp / "runners.yaml")]


def preflight(
    cluster: SlurmCluster, args: list[str], **env: str
) -> tuple[int, dict[str, list[dict[str, str]]], str]:
    proc = subprocess.run(
        [AGENTSWEEP, "preflight", "--json", "--probe-wait", "30", *args],
        env={**cluster.env, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.stdout.strip(), proc.stderr
    report = json.loads(proc.stdout)
    by_name: dict[str, list[dict[str, str]]] = {}
    for check in report["checks"]:
        by_name.setdefault(check["name"], []).append(check)
    return proc.returncode, by_name, proc.stdout


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something listens on (on every address of this host, which both test nodes share)."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_two_node_key_passes_and_its_probe_reaches_both_nodes(slurm2: SlurmCluster, tmp_path: Path) -> None:
    # tp 8 x 2 replicas on 8-GPU nodes: the cell spans both nodes.
    status, checks, out = preflight(slurm2, write(tmp_path, tp=8, replicas=2))
    assert status == 0, out
    for name in ("slurm.partition", "slurm.gres", "slurm.nodes", "traces", "node.ports"):
        assert {c["status"] for c in checks[name]} == {"PASS"}, out
    assert "largest cell spans 2" in checks["slurm.nodes"][0]["detail"]
    assert sorted(c["node"] for c in checks["node.ports"]) == sorted(NODES2)
    assert slurm2.jobs() == []  # the probe job is gone


def test_a_port_in_use_fails_on_each_node(slurm2: SlurmCluster, tmp_path: Path, busy_port: int) -> None:
    status, checks, out = preflight(slurm2, write(tmp_path, tp=8, replicas=2), PORT=str(busy_port))
    assert status == 2, out
    ports = checks["node.ports"]
    assert sorted(c["node"] for c in ports) == sorted(NODES2)
    assert all(
        c["status"] == "FAIL" and str(busy_port) in c["detail"] and "unset PORT" in c["fix"] for c in ports
    )


def test_an_unknown_partition_fails_with_the_partitions_there(slurm: SlurmCluster, tmp_path: Path) -> None:
    status, checks, out = preflight(slurm, write(tmp_path, partition="h201"))
    assert status == 2, out
    (check,) = checks["slurm.partition"]
    assert check["status"] == "FAIL" and "'h201'" in check["detail"] and "h200" in check["detail"]
    assert "partition of runner h200" in check["fix"]
    assert checks["node"][0]["status"] == "SKIP"  # no probe of a cluster that cannot take the cell


def test_a_wrong_gres_type_fails_naming_the_types_there(slurm: SlurmCluster, tmp_path: Path) -> None:
    status, checks, out = preflight(slurm, write(tmp_path, gres_type="nvidia_h200"))
    assert status == 2, out
    (check,) = checks["slurm.gres"]
    assert check["status"] == "FAIL" and "gpu:nvidia_h200" in check["detail"]
    assert all(t in check["detail"] for t in ("h200", "b200", "mi355x"))
    assert "gres_type of runner h200" in check["fix"]


def test_too_few_nodes_fails(slurm: SlurmCluster, tmp_path: Path) -> None:
    # Two nodes' worth of instances on a one-node cluster.
    status, checks, out = preflight(slurm, write(tmp_path, tp=8, replicas=2))
    assert status == 2, out
    (check,) = checks["slurm.nodes"]
    assert check["status"] == "FAIL" and "1 usable nodes" in check["detail"] and "spans 2" in check["detail"]
    assert NODE in check["detail"] and "max_nodes" in check["fix"]


def test_pyxis_missing_from_srun_fails(slurm: SlurmCluster, tmp_path: Path) -> None:
    status, checks, out = preflight(slurm, [*write(tmp_path, container_runtime="pyxis"), "--no-probe"])
    assert status == 2, out
    (check,) = checks["container.runtime"]
    assert check["status"] == "FAIL" and "--container-image" in check["detail"]
