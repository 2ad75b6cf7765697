"""The workflows' trust boundary: which code runs on the GPU runners, and what reaches their logs.

The `ref` steps run against a real git repository laid out as actions/checkout leaves it with
fetch-depth 0 (branches under refs/remotes/origin, tags under refs/tags), with a pull-request head
that is on no branch, as a fork's would be.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SETUP = "$/.github/actions/setup"
HF = "hf_" + "Zq7" * 12


def git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """origin (main, feature, tag v1, refs/pull/1/head) and a checkout of it (the runner's workspace)."""
    root = tmp_path_factory.mktemp("git")
    origin = root / "origin"
    origin.mkdir()
    git(origin, "init", "-q")
    git(origin, "commit", "-q", "--allow-empty", "-m", "a")
    main = git(origin, "rev-parse", "HEAD")
    git(origin, "tag", "v1")
    git(origin, "checkout", "-q", "-b", "feature/x")
    git(origin, "commit", "-q", "--allow-empty", "-m", "b")
    feature = git(origin, "rev-parse", "HEAD")
    git(origin, "checkout", "-q", "-b", "fork-pr")
    git(origin, "commit", "-q", "--allow-empty", "-m", "from a fork")
    pr = git(origin, "rev-parse", "HEAD")
    git(origin, "update-ref", "refs/pull/1/head", pr)
    git(origin, "checkout", "-q", "main")
    git(origin, "branch", "-q", "-D", "fork-pr")
    return {"origin": origin, "main": main, "feature": feature, "pr": pr}


def _workspace(repos: dict[str, Any], tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    git(tmp_path, "clone", "-q", str(repos["origin"]), str(ws))
    git(
        ws, "fetch", "-q", "origin", "refs/pull/1/head"
    )  # its objects are there, as checkout could fetch them
    return ws


def _run_step(
    gha: SimpleNamespace, workflow: str, job: str, name: str, inputs: dict[str, Any], ws: Path, tmp: Path
) -> Any:
    """Run one step of a job, as written in the workflow file, in the workspace ``ws``."""
    wf = gha.load_workflow(workflow)
    (step,) = [s for s in wf["jobs"][job]["steps"] if s.get("name") == name]
    only = {"defaults": wf["defaults"], "jobs": {job: {"steps": [step]}}}
    temp = tmp / "temp"
    temp.mkdir(exist_ok=True)
    return gha.run_job(only, job, {"inputs": inputs}, ws, temp, {}).step(name)


@pytest.mark.parametrize(
    ("ref", "expect"),
    [("feature/x", "feature"), ("refs/heads/feature/x", "feature"), ("v1", "main"), ("refs/tags/v1", "main")],
)
def test_a_branch_or_tag_resolves_to_its_commit(gha, repos, tmp_path, ref, expect) -> None:
    ws = _workspace(repos, tmp_path)
    step = _run_step(gha, "agentic-sweep.yml", "matrix", "Resolve the ref", {"ref": ref}, ws, tmp_path)
    assert step.returncode == 0, step.output
    assert step.outputs == {"sha": repos[expect]}
    assert git(ws, "rev-parse", "HEAD") == repos[expect]  # the matrix job itself runs that code


@pytest.mark.parametrize(
    "ref",
    ["refs/pull/1/head", "pull/1/head", "PR", "MAIN", "main~1", "main^{commit}", "HEAD", "nope", "refs/x/y"],
)
def test_pull_request_refs_commits_and_expressions_are_refused(gha, repos, tmp_path, ref) -> None:
    ref = {"PR": repos["pr"], "MAIN": repos["main"]}.get(ref, ref)
    ws = _workspace(repos, tmp_path)
    step = _run_step(gha, "agentic-sweep.yml", "matrix", "Resolve the ref", {"ref": ref}, ws, tmp_path)
    assert step.returncode == 2, step.output
    errors = [line for line in step.output.splitlines() if line.startswith("::error::")]
    assert (
        len(errors) == 1
        and f"ref '{ref}'" in errors[0]
        and "pull-request refs and commits are refused" in errors[0]
    )
    assert step.outputs == {}
    assert git(ws, "rev-parse", "HEAD") == repos["main"]


@pytest.mark.parametrize(("commit", "ok"), [("feature", True), ("main", True), ("pr", False)])
def test_the_cell_job_refuses_a_commit_on_no_branch_or_tag(gha, repos, tmp_path, commit, ok) -> None:
    ws = _workspace(repos, tmp_path)
    git(ws, "checkout", "-q", "--detach", repos[commit])
    step = _run_step(gha, "agentic-cell.yml", "cell", "Check the ref", {"ref": repos[commit]}, ws, tmp_path)
    assert step.returncode == (0 if ok else 2), step.output
    if not ok:
        assert f"::error::commit {repos['pr']} is on no branch or tag of this repository" in step.output


def test_every_job_runs_the_resolved_commit(gha) -> None:
    """inputs.ref is read once, by the resolve step; the cells and collect check out its result."""
    sweep = gha.load_workflow("agentic-sweep.yml")
    text = (REPO / ".github" / "workflows" / "agentic-sweep.yml").read_text()
    assert text.count("inputs.ref") == 1
    matrix = sweep["jobs"]["matrix"]
    names = [s.get("name") for s in matrix["steps"]]
    assert names.index("Resolve the ref") < names.index("Set up agentsweep")
    assert "ref" not in matrix["steps"][0]["with"] and matrix["steps"][0]["with"]["fetch-depth"] == 0
    assert matrix["outputs"]["sha"] == "${{ steps.ref.outputs.sha }}"
    assert sweep["jobs"]["sweep"]["with"]["sha"] == "${{ needs.matrix.outputs.sha }}"
    body = gha.load_workflow("agentic-sweep-run.yml")
    assert body["jobs"]["cells"]["with"]["ref"] == "${{ inputs.sha }}"
    collect_checkout = body["jobs"]["collect"]["steps"][0]
    assert collect_checkout["with"]["ref"] == "${{ inputs.sha }}"
    cell = gha.load_workflow("agentic-cell.yml")["jobs"]["cell"]["steps"]
    names = [s.get("name") for s in cell]
    assert names.index("Check out") < names.index("Check the ref") < names.index("Set up agentsweep")
    assert cell[0]["with"]["fetch-depth"] == 0


def test_the_cell_job_masks_secret_values_before_printing_anything(gha, tmp_path) -> None:
    cell = {"exp_name": "m-tp1-ep1-u1-off", "engine": "sim", "model": "m", "tp": 1, "users": 1}
    cell |= {"offload": "off", "duration": 5, "traces": "t", "engine_env": {"X_HEADER": f"Bearer {HF}"}}
    wf = gha.load_workflow("agentic-cell.yml")
    (step,) = [s for s in wf["jobs"]["cell"]["steps"] if s.get("name") == "Check the cell"]
    only = {"defaults": wf["defaults"], "jobs": {"cell": {"env": wf["jobs"]["cell"]["env"], "steps": [step]}}}
    ws = gha.make_workspace(tmp_path / "ws")
    temp = tmp_path / "temp"
    temp.mkdir()
    result = gha.run_job(only, "cell", {"inputs": {"cell": json.dumps(cell)}}, ws, temp, {})
    check = result.step("Check the cell")
    assert check.returncode == 0, check.output
    assert check.output.splitlines()[0] == f"::add-mask::{HF}"
    assert check.output.count(HF) == 1


def test_ci_image_is_pinned_by_digest() -> None:
    text = (REPO / ".github" / "workflows" / "ci.yml").read_text()
    (image,) = re.findall(r"^\s*image:\s*(\S+)(.*)$", text, re.M)
    assert re.fullmatch(r"python:3\.11-bookworm@sha256:[0-9a-f]{64}", image[0]), image
    assert "zizmor: ignore" not in image[1]


def test_result_dir_comes_from_the_validated_exp_name_only(gha, tmp_path) -> None:
    """A config key with commas and colons (pyxis mount separators) never reaches RESULT_DIR."""
    cell = {"config_key": "k,/etc:/etc", "exp_name": "k-tp1-ep1-u1-off", "engine": "sim", "model": "m"}
    cell |= {"tp": 1, "users": 1, "offload": "off", "duration": 5, "traces": "t"}
    wf = gha.load_workflow("agentic-cell.yml")
    (step,) = [s for s in wf["jobs"]["cell"]["steps"] if s.get("name") == "Check the cell"]
    only = {"defaults": wf["defaults"], "jobs": {"cell": {"env": wf["jobs"]["cell"]["env"], "steps": [step]}}}
    ws = gha.make_workspace(tmp_path / "ws")
    temp = tmp_path / "temp"
    temp.mkdir()
    result = gha.run_job(only, "cell", {"inputs": {"cell": json.dumps(cell)}}, ws, temp, {})
    assert result.step("Check the cell").returncode == 0, result.step("Check the cell").output
    env_file = (temp / "env-0").read_text().splitlines()
    assert env_file == ["EXP_NAME=k-tp1-ep1-u1-off", f"RESULT_DIR={ws}/results/k-tp1-ep1-u1-off"]
