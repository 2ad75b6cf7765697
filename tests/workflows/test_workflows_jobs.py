"""Run the sweep's jobs from .github/workflows/agentic-sweep.yml and agentic-cell.yml on this machine.

The command lines come from the workflow files (see conftest.py); inputs reach them the way GitHub
passes them (the `inputs` context through `env:`), and the job outputs feed the next job's
expressions exactly as written in the files.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from agentsweep.cell.allocation import time_limit_min
from agentsweep.contract.cell import Cell
from agentsweep.sweep.jobs import QUEUE_MARGIN_MIN

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SETUP = "$/.github/actions/setup"


def _noop(_with: Mapping[str, Any], _env: Mapping[str, str]) -> None:
    """actions/checkout and the setup action: the workspace already links to this checkout."""


def _recorder(store: dict[str, dict[str, Any]]) -> Callable[[Mapping[str, Any], Mapping[str, str]], None]:
    def upload(with_: Mapping[str, Any], _env: Mapping[str, str]) -> None:
        store[with_["name"]] = dict(with_)

    return upload


def _run_matrix_job(
    gha: SimpleNamespace, tmp_path: Path, **given: Any
) -> tuple[dict[str, Any], Any, dict[str, dict[str, Any]]]:
    workflow = gha.load_workflow("agentic-sweep.yml")
    inputs = gha.dispatch_inputs(workflow, given)
    workspace = gha.make_workspace(tmp_path / "ws")
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    uploads: dict[str, dict[str, Any]] = {}
    handlers = {"actions/checkout": _noop, SETUP: _noop, "actions/upload-artifact": _recorder(uploads)}
    result = gha.run_job(workflow, "matrix", {"inputs": inputs}, workspace, temp, handlers)
    return inputs, result, uploads


def _generator(gha: SimpleNamespace, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [str(gha.VENV / "bin" / "agentsweep"), "matrix", *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(proc.stdout)


def _runners() -> dict[str, Any]:
    return yaml.safe_load((REPO / "configs" / "runners.yaml").read_text(encoding="utf-8"))


def _cell_calls(
    gha: SimpleNamespace, inputs: Mapping[str, Any], matrix_outputs: Mapping[str, Any]
) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """For every matrix cell: (cell, the cell workflow's inputs, its secrets): the sweep job calls
    agentic-sweep-run.yml, whose `cells` job calls agentic-cell.yml."""
    run_wf, run_inputs, run_secrets = gha.sweep_run(inputs, matrix_outputs, {"HF_TOKEN": "hf_test_token"})
    call = run_wf["jobs"]["cells"]
    cell_wf = gha.load_workflow("agentic-cell.yml")
    matrix = gha.render(call["strategy"]["matrix"], {"inputs": run_inputs})
    out = []
    for cell in matrix["include"]:
        ctx = {"inputs": run_inputs, "matrix": cell, "secrets": run_secrets}
        given = {name: gha.render(value, ctx) for name, value in call["with"].items()}
        secrets = {name: gha.render(value, ctx) for name, value in call["secrets"].items()}
        out.append((cell, gha.call_inputs(cell_wf, given), secrets))
    return out


def test_matrix_job_writes_the_matrix_table_and_plan(gha: SimpleNamespace, tmp_path: Path) -> None:
    _, result, uploads = _run_matrix_job(gha, tmp_path, config_key="demo", tp="1", users="2,4")
    assert result.status == "success", [(s.name, s.output) for s in result.steps]

    # The matrix is the real generator's, with the filters the inputs asked for.
    matrix = json.loads(result.outputs["matrix"])
    assert matrix == _generator(gha, "--key", "demo", "--tp", "1", "--users", "2,4")
    cells = matrix["include"]
    assert {c["tp"] for c in cells} == {1} and {c["users"] for c in cells} == {2, 4}
    assert len(cells) == 2 * len({c["offload"] for c in cells}) >= 4

    # The job summary has the table; the matrix is kept for collect.
    for cell in cells:
        assert cell["exp_name"] in result.summary
    kept = Path(uploads["sweep_matrix"]["path"])
    assert json.loads(kept.read_text()) == matrix

    # Runner labels and launcher come from configs/runners.yaml; one time limit per cell.
    runners = json.loads(result.outputs["runners"])
    spec = _runners()["local"]
    assert runners == {"local": {"runs_on": spec["runs_on"], "launcher": spec["launcher"]}}
    timeouts = json.loads(result.outputs["timeouts"])
    assert set(timeouts) == {c["exp_name"] for c in cells}
    for cell in cells:
        # Longer than the launcher's own allocation limit, so Slurm ends a stuck cell first.
        allocation = time_limit_min(cell["duration"], cell["engine"], {}, 60)
        assert timeouts[cell["exp_name"]] > allocation > math.ceil(cell["duration"] / 60)
    assert int(result.outputs["max_parallel"]) >= 1


def test_matrix_job_inputs_override_duration_offload_and_parallelism(
    gha: SimpleNamespace, tmp_path: Path
) -> None:
    inputs, result, _ = _run_matrix_job(
        gha,
        tmp_path,
        config_key="llama70b-fp8-h200-vllm,demo-mini",
        offload="on,noprefix",  # any list of modes, not only the ones a choice offered
        duration=7200,
        max_parallel=3,
    )
    assert result.status == "success", [(s.name, s.output) for s in result.steps]
    cells = json.loads(result.outputs["matrix"])["include"]
    assert {c["config_key"] for c in cells} == {"llama70b-fp8-h200-vllm", "demo-mini"}
    assert {c["offload"] for c in cells} == {"on", "noprefix"}
    assert {c["duration"] for c in cells} == {7200}
    timeouts = json.loads(result.outputs["timeouts"])
    for cell in cells:
        assert timeouts[cell["exp_name"]] > time_limit_min(7200, cell["engine"], {}, 60) > 120
    # Real engines get the longer start-up margin.
    by_engine = {c["engine"]: timeouts[c["exp_name"]] for c in cells}
    assert by_engine["vllm"] > by_engine["sim"]
    runners = json.loads(result.outputs["runners"])
    assert set(runners) == {"h200", "local"}

    def max_parallel(sweep_inputs: dict[str, Any]) -> Any:
        run_wf, run_inputs, _ = gha.sweep_run(sweep_inputs, result.outputs)
        return gha.render(run_wf["jobs"]["cells"]["strategy"]["max-parallel"], {"inputs": run_inputs})

    assert max_parallel(inputs) == 3
    assert max_parallel({**inputs, "max_parallel": 0}) == int(result.outputs["max_parallel"])
    # The sweep's concurrency group: the resolved key set, however the keys were spelled.
    assert result.outputs["keys"] == "demo-mini,llama70b-fp8-h200-vllm"
    _, respelled, _ = _run_matrix_job(
        gha,
        tmp_path / "respelled",
        config_key=" demo-m*, llama70b-fp8-h200-vllm,demo-mini",
        offload="noprefix",
    )
    assert respelled.status == "success", [(s.name, s.output) for s in respelled.steps]
    assert respelled.outputs["keys"] == result.outputs["keys"]


def test_matrix_job_search_and_slo_make_capacity_cells_with_their_time_limit(
    gha: SimpleNamespace, tmp_path: Path
) -> None:
    slo = "fast: ttft p90 <= 2 s, speed p25 >= 50 tok/s; strict: e2e p99 <= 60 s"
    _, result, _ = _run_matrix_job(gha, tmp_path, config_key="demo-mini", search="2:8", slo=slo)
    assert result.status == "success", [(s.name, s.output) for s in result.steps]
    cells = [Cell.parse(c) for c in json.loads(result.outputs["matrix"])["include"]]
    assert [c.exp_name for c in cells] == [f"demo-mini-tp1-ep1-u2to8-{o}" for o in ("on", "off", "noprefix")]
    timeouts = json.loads(result.outputs["timeouts"])
    for cell in cells:
        assert cell.capacity is not None and (cell.capacity.low, cell.capacity.high) == (2, 8)
        assert [t.text() for t in cell.capacity.tiers] == [
            "fast: ttft p90 <= 2 s, output_speed p25 >= 50 tok/s",
            "strict: e2e p99 <= 60 s",
        ]
        # The job waits for the capacity cell's whole time limit, not one replay's.
        assert timeouts[cell.exp_name] == cell.capacity.time_limit_min + QUEUE_MARGIN_MIN
        assert cell.capacity.time_limit_min > time_limit_min(cell.duration, cell.engine, {}, 60)
    _, result, _ = _run_matrix_job(gha, tmp_path / "bad", config_key="demo-mini", search="8:2")
    assert result.status == "failure"
    assert any("--search '8:2': search range [8, 2]: low 8 > high 2" in s.output for s in result.steps)


def test_matrix_job_fails_with_one_line_on_a_bad_key(gha: SimpleNamespace, tmp_path: Path) -> None:
    _, result, _ = _run_matrix_job(gha, tmp_path, config_key="demo-mni")
    step = result.step("Expand the matrix")
    assert step.returncode == 2
    assert "Traceback" not in step.output
    assert "demo-mni" in step.output and "demo-mini" in step.output  # names it and suggests
    assert result.status == "failure"
    assert not result.step("Resolve runners and time limits").ran


def test_every_cell_reaches_its_runner_with_the_cell_as_env(gha: SimpleNamespace, tmp_path: Path) -> None:
    """cells job -> agentic-cell.yml: typed inputs, runs-on, time limit, and the launcher's env."""
    inputs, result, _ = _run_matrix_job(gha, tmp_path, config_key="*-vllm,demo", users="1,2,4")
    assert result.status == "success", [(s.name, s.output) for s in result.steps]
    cell_wf = gha.load_workflow("agentic-cell.yml")
    cell_job = cell_wf["jobs"]["cell"]
    (check,) = [s for s in cell_job["steps"] if s.get("name") == "Check the cell"]
    (launch,) = [s for s in cell_job["steps"] if s.get("name") == "Run the cell"]
    only_check = {**cell_wf, "jobs": {"cell": {**cell_job, "steps": [check]}}}
    runners = _runners()
    calls = _cell_calls(gha, inputs, result.outputs)
    assert len(calls) == len(json.loads(result.outputs["matrix"])["include"]) > 20
    workspace = gha.make_workspace(tmp_path / "ws-cell")
    for i, (cell, cell_inputs, secrets) in enumerate(calls):
        ctx = {"inputs": cell_inputs, "secrets": secrets, "github": {"workspace": "/ws"}}
        assert gha.render(cell_job["runs-on"], ctx) == runners[cell["runner"]]["runs_on"]
        timeout = gha.render(cell_job["timeout-minutes"], ctx)
        assert isinstance(timeout, int) and timeout > cell["duration"] / 60
        job_env = {k: gha.to_text(gha.render(v, ctx)) for k, v in cell_job["env"].items()}
        env = {
            **job_env,
            **{k: gha.to_text(gha.render(v, {**ctx, "env": job_env})) for k, v in launch["env"].items()},
        }
        # What the launcher reads back is the generator's cell, field for field.
        assert Cell.parse(env["AGENTSWEEP_CELL"]).model_dump(mode="json") == cell
        assert env["LAUNCHER"] == runners[cell["runner"]]["launcher"]
        assert env["HF_TOKEN"] == "hf_test_token"
        if i < 3:  # the check step (a real process per cell) names the result directory
            temp = tmp_path / f"temp-{i}"
            temp.mkdir()
            checked = gha.run_job(only_check, "cell", {"inputs": cell_inputs}, workspace, temp, {})
            assert checked.status == "success", checked.steps[0].output
            env_lines = (temp / "env-0").read_text().splitlines()
            assert env_lines == [
                f"EXP_NAME={cell['exp_name']}",
                f"RESULT_DIR={workspace}/results/{cell['exp_name']}",
            ]


def test_a_cell_with_a_path_in_its_name_never_reaches_a_path(gha: SimpleNamespace, tmp_path: Path) -> None:
    """The check step refuses a cell whose exp_name is not a safe name; nothing else runs."""
    cell_wf = gha.load_workflow("agentic-cell.yml")
    cell = {"exp_name": "x/../../victim", "engine": "sim", "model": "m", "tp": 1, "users": 1}
    cell |= {"offload": "off", "duration": 5, "traces": "t"}
    inputs = {"runs_on": '["ubuntu-latest"]', "launcher": "runners/launch_local.sh", "timeout_minutes": 5}
    inputs |= {"ref": "", "cell": json.dumps(cell)}
    handlers = {"actions/checkout": lambda *_: None, SETUP: lambda *_: None}
    result = gha.run_job(
        cell_wf,
        "cell",
        {"inputs": inputs, "secrets": {}},
        gha.make_workspace(tmp_path / "ws"),
        tmp_path,
        handlers,
    )
    check = result.step("Check the cell")
    assert check.returncode == 2 and "exp_name" in check.output and "Traceback" not in check.output
    assert not result.step("Run the cell").ran
    assert not result.step("Upload the cell result directory").ran


def test_ci_dry_runs_every_config_key(gha: SimpleNamespace, tmp_path: Path) -> None:
    workflow = gha.load_workflow("ci.yml")
    job_id = next(iter(workflow["jobs"]))
    only = {"jobs": {job_id: {**workflow["jobs"][job_id], "steps": []}}, "defaults": workflow["defaults"]}
    (dry,) = [s for s in workflow["jobs"][job_id]["steps"] if s.get("name") == "Dry run of every config key"]
    only["jobs"][job_id]["steps"] = [dry]
    workspace = gha.make_workspace(tmp_path / "ws")
    temp = tmp_path / "temp"
    temp.mkdir()
    result = gha.run_job(only, job_id, {}, workspace, temp, {})
    step = result.step("Dry run of every config key")
    assert step.returncode == 0, step.output
    listing = subprocess.run(
        [str(gha.VENV / "bin" / "agentsweep"), "matrix", "--list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for key in (line.split()[0] for line in listing.splitlines()):
        assert f"configs/agentic.yaml: {key}" in step.output

    # A broken config file fails the step (the loop does not swallow errors).
    bad = tmp_path / "ws-bad"
    bad.mkdir()
    for entry in workspace.iterdir():
        if entry.name != "configs":
            (bad / entry.name).symlink_to(entry.resolve())
    (bad / "configs").mkdir()
    shutil.copy(REPO / "configs" / "runners.yaml", bad / "configs" / "runners.yaml")
    (bad / "configs" / "broken.yaml").write_text("demo:\n  runner: nowhere\n")
    step = gha.run_job(only, job_id, {}, bad, temp, {}).step("Dry run of every config key")
    assert step.returncode != 0
    assert "broken.yaml" in step.output


@pytest.mark.parametrize("bad", ["demo\nx", "$(touch pwned)", "demo; touch pwned"])
def test_hostile_inputs_stay_data(gha: SimpleNamespace, tmp_path: Path, bad: str) -> None:
    """Inputs reach the script as env values: a key full of shell syntax is just a bad key."""
    _, result, _ = _run_matrix_job(gha, tmp_path, config_key=bad, tp="1")
    assert result.step("Expand the matrix").returncode == 2
    assert not (tmp_path / "ws" / "pwned").exists() and not (REPO / "pwned").exists()


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        ("not json", "cannot read the matrix JSON"),
        ('{"include": []}', "at least one cell"),
        ('{"include": [{"exp_name": "a", "runner": "local", "engine": "sim"}]}', "include[0].duration"),
        (
            '{"include": [{"exp_name": "a", "runner": "h100", "engine": "vllm", "duration": 60}]}',
            "runner 'h100' is not in runners.yaml",
        ),
    ],
)
def test_cell_jobs_refuse_bad_input_in_one_line(
    gha: SimpleNamespace, tmp_path: Path, matrix: str, message: str
) -> None:
    path = tmp_path / "matrix.json"
    path.write_text(matrix)
    out = tmp_path / "github_output"
    proc = subprocess.run(
        [str(gha.VENV / "bin" / "agentsweep"), "cell-jobs", "--matrix", str(path)],
        cwd=REPO,
        env={**os.environ, "GITHUB_OUTPUT": str(out)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not out.exists() or out.read_text() == ""


def test_cell_jobs_print_their_outputs_without_github_output(gha: SimpleNamespace, tmp_path: Path) -> None:
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(_generator(gha, "--key", "demo-mini")))
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_OUTPUT"}
    proc = subprocess.run(
        [str(gha.VENV / "bin" / "agentsweep"), "cell-jobs", "--matrix", str(path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    outputs = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    assert json.loads(outputs["runners"]) == {
        "local": {"runs_on": ["ubuntu-latest"], "launcher": "runners/launch_local.sh"}
    }
    timeouts = json.loads(outputs["timeouts"])
    assert set(timeouts) == {
        "demo-mini-tp1-ep1-u2-on",
        "demo-mini-tp1-ep1-u2-off",
        "demo-mini-tp1-ep1-u2-noprefix",
    }
    assert set(timeouts.values()) == {time_limit_min(8, "sim", {}, 60) + 60}
