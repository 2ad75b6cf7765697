"""The workflows against the other parts: matrix fields, runner labels, documented inputs."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from agentsweep.contract.cell import Cell

REPO = Path(__file__).resolve().parents[2]
# Inputs of agentic-cell.yml: the cell as one JSON value, and what the sweep's matrix job resolved.
CELL_CALL_INPUTS = {"cell", "runs_on", "launcher", "timeout_minutes", "ref"}
MAX_CELL_INPUTS = 10
# Labels GitHub itself provides (the self-hosted ones are listed in .github/actionlint.yaml).
GITHUB_HOSTED = {"ubuntu-latest", "ubuntu-24.04", "ubuntu-22.04", "ubuntu-slim"}
_EXPR_ONLY = re.compile(r"^\$\{\{\s*(?P<ctx>matrix|inputs)\.(?P<name>[a-z_]+)\s*\}\}$")


def _config_files() -> list[Path]:
    return sorted(
        p for p in (REPO / "configs").glob("*.yaml") if p.name not in ("runners.yaml", "images.lock.yaml")
    )


def _agentsweep(gha: SimpleNamespace, *args: str) -> str:
    proc = subprocess.run(
        [str(gha.VENV / "bin" / "agentsweep"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _generated_cells(gha: SimpleNamespace) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for config in _config_files():
        rel = str(config.relative_to(REPO))
        keys = [
            line.split()[0] for line in _agentsweep(gha, "matrix", "--config", rel, "--list").splitlines()
        ]
        assert keys, f"{rel}: no config keys"
        for key in keys:
            data = json.loads(_agentsweep(gha, "matrix", "--config", rel, "--key", key, "--json"))
            out[f"{rel}:{key}"] = data["include"]
    return out


@pytest.fixture(scope="module")
def cells_by_key(gha: SimpleNamespace) -> dict[str, list[dict[str, Any]]]:
    """Every cell of every config key, from the real generator (`agentsweep matrix --json`)."""
    return _generated_cells(gha)


@pytest.fixture
def emitted(cells_by_key: dict[str, list[dict[str, Any]]]) -> set[str]:
    """The field set the generator emits; every cell of every key has exactly this set."""
    sets = {frozenset(cell) for cells in cells_by_key.values() for cell in cells}
    assert len(sets) == 1, f"cells differ in their fields: {sets}"
    return set(next(iter(sets)))


def test_the_cell_workflow_takes_the_cell_as_one_input(gha: SimpleNamespace) -> None:
    declared = gha.load_workflow("agentic-cell.yml")["on"]["workflow_call"]["inputs"]
    assert set(declared) == CELL_CALL_INPUTS and len(declared) <= MAX_CELL_INPUTS
    assert declared["cell"] == {**declared["cell"], "type": "string", "required": True}


def test_the_sweep_passes_the_whole_matrix_cell(gha: SimpleNamespace) -> None:
    call = gha.load_workflow("agentic-sweep-run.yml")["jobs"]["cells"]
    assert set(call["with"]) == CELL_CALL_INPUTS
    assert re.fullmatch(r"\$\{\{\s*toJSON\(matrix\)\s*\}\}", call["with"]["cell"])
    # No input is taken from a single matrix field any more: the cell travels whole.
    assert not any(_EXPR_ONLY.match(str(v)) and "matrix." in str(v) for v in call["with"].values())


def test_the_launcher_gets_the_cell_as_one_variable(gha: SimpleNamespace) -> None:
    job = gha.load_workflow("agentic-cell.yml")["jobs"]["cell"]
    assert job["env"] == {"AGENTSWEEP_CELL": "${{ inputs.cell }}"}
    (step,) = [s for s in job["steps"] if s.get("name") == "Run the cell"]
    assert set(step["env"]) == {"LAUNCHER", "HF_TOKEN"}


@pytest.mark.integration
def test_every_generated_cell_is_what_the_cell_job_reads(
    gha: SimpleNamespace, cells_by_key: dict[str, list[dict[str, Any]]]
) -> None:
    """toJSON(matrix) of every generated cell parses back into the same typed cell."""
    for where, cells in cells_by_key.items():
        for cell in cells:
            text = gha.to_text(cell)  # what toJSON(matrix) makes of it
            assert Cell.parse(text).model_dump(mode="json") == cell, f"{where} {cell['exp_name']}"


def test_runner_labels_are_known_to_actionlint(gha: SimpleNamespace) -> None:
    runners = yaml.safe_load((REPO / "configs" / "runners.yaml").read_text(encoding="utf-8"))
    lint = yaml.safe_load((REPO / ".github" / "actionlint.yaml").read_text(encoding="utf-8"))
    listed = set(lint["self-hosted-runner"]["labels"])
    for key, spec in runners.items():
        labels = set(spec["runs_on"])
        if "self-hosted" in labels:
            assert labels - {"self-hosted", "linux", "x64"} <= listed, (
                f"{key}: add its labels to actionlint.yaml"
            )
        else:
            assert labels <= GITHUB_HOSTED, f"{key}: {labels}"
        assert (REPO / spec["launcher"]).is_file(), f"{key}: launcher {spec['launcher']} is missing"


def _documented_inputs(text: str) -> set[str]:
    return set(re.findall(r"-f\s+([a-z_]+)=", text))


def test_documented_inputs_exist(gha: SimpleNamespace) -> None:
    inputs = set(gha.load_workflow("agentic-sweep.yml")["on"]["workflow_dispatch"]["inputs"])
    docs = (REPO / "docs" / "workflows.md").read_text(encoding="utf-8")
    named = _documented_inputs(docs)
    readme = REPO / "README.md"
    named |= _documented_inputs(readme.read_text(encoding="utf-8"))
    assert "config_key" in named
    assert named <= inputs, f"documented but not inputs: {sorted(named - inputs)}"
    # The docs' input table names every input.
    section = docs.split("### Inputs of agentic-sweep.yml", 1)[1].split("\n#", 1)[0]
    table = set(re.findall(r"^\|\s*`([a-z_]+)`\s*\|", section, flags=re.M))
    assert table == inputs, f"docs/workflows.md input table: {sorted(table ^ inputs)}"
