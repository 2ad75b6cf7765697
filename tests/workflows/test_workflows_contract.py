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

REPO = Path(__file__).resolve().parents[2]
# Inputs of agentic-cell.yml that are not matrix cell fields (resolved by the sweep's matrix job).
CELL_CALL_EXTRAS = {"runs_on", "launcher", "timeout_minutes", "ref"}
# Launch-step environment that is not a matrix cell field.
LAUNCH_ENV_EXTRAS = {"LAUNCHER", "HF_TOKEN", "RESULT_DIR"}
# Labels GitHub itself provides (the self-hosted ones are listed in .github/actionlint.yaml).
GITHUB_HOSTED = {"ubuntu-latest", "ubuntu-24.04", "ubuntu-22.04", "ubuntu-slim"}
_EXPR_ONLY = re.compile(r"^\$\{\{\s*(?P<ctx>matrix|inputs)\.(?P<name>[a-z_]+)\s*\}\}$")


def _config_files() -> list[Path]:
    return sorted(p for p in (REPO / "configs").glob("*.yaml") if p.name != "runners.yaml")


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


def test_the_cell_workflow_declares_exactly_the_emitted_fields(
    gha: SimpleNamespace, emitted: set[str]
) -> None:
    declared = set(gha.load_workflow("agentic-cell.yml")["on"]["workflow_call"]["inputs"])
    assert declared - CELL_CALL_EXTRAS == emitted, (
        f"emitted, not consumed: {sorted(emitted - declared)}; "
        f"consumed, not emitted: {sorted(declared - CELL_CALL_EXTRAS - emitted)}"
    )


def test_the_sweep_passes_every_field_from_the_matrix(gha: SimpleNamespace, emitted: set[str]) -> None:
    call = gha.load_workflow("agentic-sweep.yml")["jobs"]["cells"]
    fields = {k: v for k, v in call["with"].items() if k not in CELL_CALL_EXTRAS}
    assert set(fields) == emitted
    for name, value in fields.items():
        m = _EXPR_ONLY.match(str(value))
        assert m and m["ctx"] == "matrix" and m["name"] == name, f"{name}: {value}"


def test_the_launcher_gets_every_field_as_upper_case_env(gha: SimpleNamespace, emitted: set[str]) -> None:
    job = gha.load_workflow("agentic-cell.yml")["jobs"]["cell"]
    (step,) = [s for s in job["steps"] if s.get("name") == "Run the cell"]
    env = {**job.get("env", {}), **step["env"]}
    fields = {k: v for k, v in env.items() if k not in LAUNCH_ENV_EXTRAS}
    assert set(fields) == {name.upper() for name in emitted}
    for var, value in fields.items():
        m = _EXPR_ONLY.match(str(value))
        assert m and m["ctx"] == "inputs" and m["name"] == var.lower(), f"{var}: {value}"


def test_input_types_fit_every_generated_value(
    gha: SimpleNamespace, cells_by_key: dict[str, list[dict[str, Any]]]
) -> None:
    declared = gha.load_workflow("agentic-cell.yml")["on"]["workflow_call"]["inputs"]
    for where, cells in cells_by_key.items():
        for cell in cells:
            for name, value in cell.items():
                kind = declared[name]["type"]
                ok = {
                    "string": isinstance(value, str),
                    "number": isinstance(value, int | float) and not isinstance(value, bool),
                    "boolean": isinstance(value, bool),
                }[kind]
                assert ok, f"{where} {cell['exp_name']}.{name}={value!r} does not fit type {kind}"
                if declared[name].get("required"):
                    assert value != "" or kind != "string", f"{where}: required {name} is empty"


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
