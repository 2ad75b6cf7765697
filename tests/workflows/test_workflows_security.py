"""Hardening rules every workflow and local action keeps (read from the files themselves)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GITHUB = REPO / ".github"
WORKFLOW_FILES = sorted((GITHUB / "workflows").glob("*.yml"))
ACTION_FILES = sorted((GITHUB / "actions").glob("*/action.yml"))
ALL_FILES = WORKFLOW_FILES + ACTION_FILES
EXPECTED_WORKFLOWS = {
    "agentic-sweep.yml",
    "agentic-sweep-run.yml",
    "agentic-cell.yml",
    "ci.yml",
    "images-lock.yml",
}
# The one job that writes: it pushes the images-lock branch and opens its pull request, and runs no code
# of this repository (the job that runs it, to resolve the digests, reads only).
WRITERS = {("images-lock.yml", "pull-request"): {"contents": "write", "pull-requests": "write"}}

_USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>[^\s#]+)\s*(?:#\s*(?P<comment>.*))?$")
_PINNED = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}$")
_VERSION = re.compile(r"^v\d+(\.\d+){0,2}$")


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in data:  # PyYAML reads the key `on` as a boolean
        data["on"] = data.pop(True)
    return data


def _walk(node: Any, path: str = ""):
    """Yield (path, key, value) for every mapping entry in a YAML tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key, value
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, f"{path}[{i}]")


def _steps(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if "jobs" in data:
        return [(job_id, step) for job_id, job in data["jobs"].items() for step in job.get("steps", [])]
    return [("runs", step) for step in data["runs"].get("steps", [])]


def test_the_workflows_exist() -> None:
    assert {p.name for p in WORKFLOW_FILES} == EXPECTED_WORKFLOWS


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_uses_is_pinned_to_a_commit_with_its_version(path: Path) -> None:
    seen = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _USES_LINE.match(line)
        if not m:
            continue
        seen += 1
        ref = m.group("ref")
        if ref.startswith("$/"):
            continue  # this repository, at the workflow's own commit
        assert not ref.startswith("./"), f"{path.name}: use the self-repository form $/ instead of {ref}"
        assert _PINNED.match(ref), f"{path.name}: {ref} is not pinned to a full commit SHA"
        comment = (m.group("comment") or "").strip()
        assert _VERSION.match(comment), f"{path.name}: {ref} needs its version as a comment (# vX.Y.Z)"
    # Every uses: was seen by the line scan (none hides in a flow mapping).
    parsed = sum(1 for _, key, _ in _walk(_load(path)) if key == "uses")
    assert seen == parsed > 0


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_expression_inside_a_run_script(path: Path) -> None:
    for where, key, value in _walk(_load(path)):
        if key == "run":
            assert "${{" not in str(value), f"{path.name}{where}: inputs reach scripts through env: only"


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_permissions_are_read_only_everywhere(path: Path) -> None:
    data = _load(path)
    assert data.get("permissions") in ({"contents": "read"}, {}), "top-level permissions"
    for job_id, job in data["jobs"].items():
        assert "permissions" in job, f"{job_id} declares no permissions"
        perms = job["permissions"] or {}
        if (path.name, job_id) in WRITERS:
            assert perms == WRITERS[path.name, job_id], f"{job_id}: {perms}"
            continue
        assert all(level in ("read", "none") for level in perms.values()), f"{job_id}: {perms}"


def test_the_job_that_writes_runs_no_code_of_this_repository() -> None:
    """The images-lock pull request is made with git and gh from a file checked line by line; the
    digests are resolved (with the project's code, from the network) in a job that reads only."""
    jobs = _load(GITHUB / "workflows" / "images-lock.yml")["jobs"]
    assert jobs["lock"]["permissions"] == {"contents": "read"}
    writer = jobs["pull-request"]
    assert writer["needs"] == "lock"
    uses = [str(s.get("uses", "")) for s in writer["steps"] if "uses" in s]
    assert [u.split("@")[0] for u in uses] == ["actions/checkout", "actions/download-artifact"]
    scripts = "\n".join(str(s.get("run", "")) for s in writer["steps"])
    assert not [word for word in (".venv", "python", "pip ", "make ", "bash ", "./") if word in scripts]
    assert "sha256:[0-9a-f]{64}" in scripts  # the file's every line is checked before it is committed


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_jobs_have_time_limits(path: Path) -> None:
    for job_id, job in _load(path)["jobs"].items():
        if "uses" in job:
            continue  # a reusable-workflow call: the called jobs carry the limit
        assert "timeout-minutes" in job, job_id


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_checkout_never_keeps_credentials(path: Path) -> None:
    checkouts = [s for _, s in _steps(_load(path)) if str(s.get("uses", "")).startswith("actions/checkout@")]
    for step in checkouts:
        assert step.get("with", {}).get("persist-credentials") is False


def test_no_dangerous_triggers() -> None:
    for path in WORKFLOW_FILES:
        triggers = _load(path)["on"]
        names = (
            set(triggers)
            if isinstance(triggers, dict)
            else set(triggers if isinstance(triggers, list) else [triggers])
        )
        assert not names & {"pull_request_target", "workflow_run", "issue_comment"}, path.name


def test_secrets_only_where_the_cell_runs() -> None:
    """HF_TOKEN goes from the sweep job through the cells call to the cell's launch step, nowhere else."""
    places: list[str] = []
    for path in WORKFLOW_FILES + ACTION_FILES:
        text = path.read_text(encoding="utf-8")
        assert "secrets: inherit" not in text, path.name
        for _, key, value in _walk(_load(path)):
            if isinstance(value, str) and "secrets." in value:
                places.append(f"{path.name}:{key}={value}")
    assert sorted(places) == sorted(
        [
            "agentic-sweep.yml:HF_TOKEN=${{ secrets.HF_TOKEN }}",
            "agentic-sweep-run.yml:HF_TOKEN=${{ secrets.HF_TOKEN }}",
            "agentic-cell.yml:HF_TOKEN=${{ secrets.HF_TOKEN }}",
        ]
    )
    cell = _load(GITHUB / "workflows" / "agentic-cell.yml")
    holders = [s["name"] for s in cell["jobs"]["cell"]["steps"] if "HF_TOKEN" in s.get("env", {})]
    assert holders == ["Run the cell"]
    assert "HF_TOKEN" not in cell["jobs"]["cell"].get("env", {})


def test_sweep_inputs_are_typed() -> None:
    inputs = _load(GITHUB / "workflows" / "agentic-sweep.yml")["on"]["workflow_dispatch"]["inputs"]
    assert all("type" in spec for spec in inputs.values())
    assert inputs["config_key"]["required"] is True
    assert inputs["duration"]["type"] == inputs["max_parallel"]["type"] == "number"
    # Any comma list of modes, as the CLI's --offload takes it (a choice offered five of them).
    assert inputs["offload"]["type"] == "string" and inputs["offload"]["default"] == ""


def test_sweep_runs_once_per_key_set() -> None:
    """The body of the sweep (cells and collect) runs in a group named by the matrix job's resolved key
    set, not by the raw input: `demo,demo-mini` and `demo-m*, demo` are one sweep."""
    data = _load(GITHUB / "workflows" / "agentic-sweep.yml")
    assert "concurrency" not in data  # the raw key text names nothing
    assert set(data["jobs"]) == {"matrix", "sweep"}
    sweep = data["jobs"]["sweep"]
    assert sweep["needs"] == "matrix" and sweep["uses"] == "$/.github/workflows/agentic-sweep-run.yml"
    assert sweep["concurrency"]["group"] == "agentic-sweep-${{ needs.matrix.outputs.keys }}"
    assert sweep["concurrency"]["cancel-in-progress"] is False  # never kill a running GPU sweep
    assert data["jobs"]["matrix"]["outputs"]["keys"] == "${{ steps.matrix.outputs.keys }}"
    assert "inputs.config_key" in data["run-name"]
    body = _load(GITHUB / "workflows" / "agentic-sweep-run.yml")
    assert set(body["jobs"]) == {"cells", "collect"} and "workflow_call" in body["on"]


def test_cell_artifacts_are_uploaded_even_when_the_cell_fails() -> None:
    steps = _load(GITHUB / "workflows" / "agentic-cell.yml")["jobs"]["cell"]["steps"]
    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    # Named after the exp_name the check step validated (never a raw input), whenever it got that far.
    assert [u["with"]["name"] for u in uploads] == [
        "agentic_${{ env.EXP_NAME }}",
        "serverlog_${{ env.EXP_NAME }}",
    ]
    assert all(u.get("if") == "${{ always() && env.EXP_NAME }}" for u in uploads)
    # The cell directory leaves raw per-chunk dumps out.
    assert "!${{ env.RESULT_DIR }}/debug_trace.jsonl" in uploads[0]["with"]["path"]
    # Only cell directories match the collect job's download pattern.
    assert not "serverlog_".startswith("agentic_")
