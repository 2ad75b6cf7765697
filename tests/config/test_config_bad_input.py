"""Bad input found by a sweep over `agentsweep matrix`: each gives one line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.config.matrix import offload_budget_gb
from agentsweep.config.schema import RunnerSpec

ENTRY = """\
k:
  runner: local
  engine: sim
  model: m
  precision: fp8
  duration: 10
  traces: t
  speed: {speed}
  search_space:
    tp1: {{users: [1]}}
"""
RUNNERS = (
    "local:\n  runs_on: [x]\n  launcher: runners/launch_local.sh\n  gpus_per_node: {gpn}\n"
    "  cpu_dram_gb: {dram}\n  container_runtime: none\n  hardware: h200\n"
)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_config_number_is_refused(cli, in_tmp: Path, value: str) -> None:
    # Infinity used to pass validation and come out as `Infinity` in the matrix: invalid JSON.
    (in_tmp / "bad.yaml").write_text(ENTRY.format(speed=value))
    result = cli("--config", "bad.yaml", "--key", "k", "--json")
    shown = {".inf": "inf", "-.inf": "-inf", ".nan": "nan"}[value]
    assert (result.rc, result.out) == (2, "")
    assert result.err == f"config error: bad.yaml:k.speed: must be a finite number, got {shown}\n"


def test_infinite_runner_budget_is_refused(cli, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (in_tmp / "runners.yaml").write_text(RUNNERS.format(gpn=8, dram=".inf"))
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", "runners.yaml")
    (in_tmp / "ok.yaml").write_text(ENTRY.format(speed=1))
    result = cli("--config", "ok.yaml", "--key", "k", "--json")
    assert (result.rc, result.err) == (
        2,
        "config error: runners.yaml:local.cpu_dram_gb: must be a finite number, got inf\n",
    )


@pytest.mark.parametrize(
    ("dram", "gpus", "gpn", "expected"),
    [
        (2.8, 3, 4, 2.1),
        (5.6, 3, 8, 2.1),
        (5.6, 6, 8, 4.2),
        (0.7, 1, 1, 0.7),
        (64, 3, 8, 24.0),
        (1, 1, 3, 0.3),
    ],
)
def test_offload_budget_floors_the_exact_share(dram: float, gpus: int, gpn: int, expected: float) -> None:
    # Binary floating point put 2.8 * 3 / 4 * 10 at 20.999..., flooring a 2.1 GiB share to 2.0.
    runner = RunnerSpec(
        runs_on=["x"],
        launcher="runners/launch_local.sh",
        gpus_per_node=gpn,
        cpu_dram_gb=dram,
        container_runtime="none",
    )
    assert offload_budget_gb(runner, gpus) == expected


def test_cell_budget_in_the_matrix_is_the_exact_share(
    cli, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (in_tmp / "runners.yaml").write_text(RUNNERS.format(gpn=4, dram=2.8))
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", "runners.yaml")
    (in_tmp / "ok.yaml").write_text(ENTRY.format(speed=1).replace("tp1: {users: [1]}", "tp3: {users: [1]}"))
    result = cli("--config", "ok.yaml", "--key", "k", "--json", "--offload", "on")
    assert result.rc == 0, result.err
    assert [c["cpu_dram_gb"] for c in json.loads(result.out)["include"]] == [2.1]


@pytest.mark.parametrize("variable", ["GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY"])
def test_unwritable_github_file_is_one_line(
    cli, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    (in_tmp / "ok.yaml").write_text(ENTRY.format(speed=1))
    (in_tmp / "a-dir").mkdir()
    monkeypatch.setenv("GITHUB_OUTPUT", str(in_tmp / "out.txt"))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(in_tmp / "summary.md"))
    monkeypatch.setenv(variable, str(in_tmp / "a-dir"))
    result = cli("--config", "ok.yaml", "--key", "k", "--github-output")
    assert result.rc == 2
    assert result.err == f"input error: ${variable} ({in_tmp / 'a-dir'}): cannot append: Is a directory\n"


def test_site_gres_names_keep_the_hardware_identity(
    cli, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster whose gres.conf says nvidia_h200 is set up through runners.yaml alone."""
    base = RUNNERS.format(gpn=8, dram=8).replace("  hardware: h200\n", "")
    site = RunnerSpec(
        runs_on=["x"], launcher="runners/launch_h200.sh", gpus_per_node=8, gres_type="nvidia_h200",
        hardware="h200", cpu_dram_gb=1, container_runtime="none",
    )  # fmt: skip
    assert (site.gres_type, site.hardware) == ("nvidia_h200", "h200")
    known = RunnerSpec(
        runs_on=["x"], launcher="runners/launch_b200.sh", gpus_per_node=8, gres_type="b200",
        cpu_dram_gb=1, container_runtime="none",
    )  # fmt: skip
    assert known.hardware == "b200"  # a known GRES name implies the hardware
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", "runners.yaml")
    (in_tmp / "ok.yaml").write_text(ENTRY.format(speed=1))
    for extra, message in (
        ("  gres_type: nvidia h200\n", "local.gres_type: String should match pattern"),
        (
            "  hardware: a100\n",
            "local.hardware: 'a100' is not one of h200, b200, b300, gb200, gb300, mi325x, mi355x",
        ),
    ):
        (in_tmp / "runners.yaml").write_text(base + extra)
        result = cli("--config", "ok.yaml", "--key", "k", "--json")
        assert result.rc == 2 and result.err.count("\n") == 1, result.err
        assert result.err.startswith("config error: runners.yaml:") and message in result.err, result.err
