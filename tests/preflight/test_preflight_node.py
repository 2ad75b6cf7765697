"""Node checks on recorded real tool output (fixtures/README.md says where each file comes from)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentsweep.preflight.node import (
    NodeSpec,
    check_gpus,
    check_memory,
    mem_available_gib,
    parse_amd_smi_list,
    parse_nvidia_smi_list,
)

FIXTURES = Path(__file__).parent / "fixtures"
NVIDIA_L = (FIXTURES / "nvidia-smi-L.h100.txt").read_text()
AMD_LIST = (FIXTURES / "amd-smi-list.from-amd-docs.txt").read_text()


def replay(text: str, status: int = 0):  # type: ignore[no-untyped-def]
    """A run function that answers with recorded output, and keeps the command it was asked."""
    asked: list[list[str]] = []

    def run(argv: Sequence[str]) -> tuple[int, str]:
        asked.append(list(argv))
        return status, text

    run.asked = asked  # type: ignore[attr-defined]
    return run


def spec(**changes: object) -> NodeSpec:
    base: dict[str, object] = {
        "runner": "h200",
        "vendor": "nvidia",
        "hardware": "h200",
        "gpus": 8,
        "mem_gb": 0,
    }
    return NodeSpec(**{**base, **changes})  # type: ignore[arg-type]


def test_nvidia_smi_list_is_read() -> None:
    ((index, name, uuid),) = parse_nvidia_smi_list(NVIDIA_L)
    assert (index, name) == (0, "NVIDIA H100 80GB HBM3") and uuid.startswith("GPU-3560572e")


def test_a_node_with_other_gpus_than_the_runner_claims_fails() -> None:
    run = replay(NVIDIA_L)
    check = check_gpus(spec(), "gpu07", run)
    assert run.asked == [["nvidia-smi", "-L"]]
    assert check.status == "FAIL" and check.node == "gpu07"
    assert "1 GPUs (NVIDIA H100 80GB HBM3)" in check.detail and "claims 8 H200" in check.detail
    assert "runner h200" in check.fix


def test_a_node_showing_what_the_runner_claims_passes() -> None:
    check = check_gpus(spec(runner="h100", hardware="", gpus=1), "gpu07", replay(NVIDIA_L))
    assert check.status == "PASS" and "NVIDIA H100 80GB HBM3" in check.detail


def test_amd_smi_list_is_counted() -> None:
    assert parse_amd_smi_list(AMD_LIST) == list(range(8))
    mi = spec(runner="mi355x", vendor="amd", hardware="mi355x")
    assert check_gpus(mi, "n1", replay(AMD_LIST)).status == "PASS"
    short = check_gpus(NodeSpec(**{**mi.__dict__, "gpus": 16}), "n1", replay(AMD_LIST))
    assert short.status == "FAIL" and "lists 8 GPUs, runner claims 16" in short.detail


def test_no_nvidia_smi_on_this_machine_fails_with_the_fix() -> None:
    check = check_gpus(spec(), "here")  # the real lookup: this machine has no NVIDIA driver
    assert (
        check.status == "FAIL" and "nvidia-smi" in check.detail and "install the NVIDIA driver" in check.fix
    )


def test_the_simulated_engine_needs_no_gpu() -> None:
    assert check_gpus(spec(simulated=True), "here", replay("")).status == "SKIP"


def test_memory_is_checked_against_the_offload_ask() -> None:
    meminfo = Path("/proc/meminfo").read_text()
    have = mem_available_gib(meminfo)
    assert have is not None and have > 0
    enough = check_memory(spec(mem_gb=1), "here", meminfo)
    too_much = check_memory(spec(mem_gb=int(have) + 1000), "here", meminfo)
    assert enough.status == "PASS"
    assert too_much.status == "FAIL" and "lower cpu_dram_gb of runner h200" in too_much.fix
    assert check_memory(spec(mem_gb=0), "here", meminfo).status == "SKIP"
