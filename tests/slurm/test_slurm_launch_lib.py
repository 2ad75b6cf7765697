"""The launcher library's pieces, without a cluster: job id parsing, export list, enroot import, dry runs."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from agentsweep.cell.allocation import mem_gb, time_limit_min
from agentsweep.commands.allocation import main as allocation_main
from agentsweep.contract.cell import CELL_ENV_VAR, Cell

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "runners" / "lib"


def bash(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `script` with the library sourced."""
    prelude = f"set -euo pipefail; source {LIB}/common.sh; source {LIB}/slurm.sh; source {LIB}/container.sh\n"
    return subprocess.run(
        ["bash", "-c", prelude + script],
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("salloc_output", "job_id"),
    [
        ("salloc: Granted job allocation 4242\n", "4242"),
        (
            "salloc: Pending job allocation 77\nsalloc: job 77 queued and waiting for resources\n"
            "salloc: job 77 has been allocated resources\nsalloc: Granted job allocation 77\n",
            "77",
        ),
        ("salloc: Granted job allocation 12 \nsalloc: Waiting for resource configuration\n", "12"),
    ],
)
def test_parse_job_id_finds_the_one_id(tmp_path, salloc_output, job_id):
    log = tmp_path / "salloc.log"
    log.write_text(salloc_output)
    proc = bash(f"as_parse_job_id {log}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{job_id}\n"


@pytest.mark.parametrize(
    ("salloc_output", "message"),
    [
        ("salloc: error: Job submit/allocate failed: Invalid account\n", "no job id"),
        ("", "no job id"),
        (
            "salloc: Granted job allocation 1\nsalloc: Granted job allocation 2\n",
            "more than one job id in salloc's output: 1 2",
        ),
        ("salloc: Granted job allocation 99x\n", "no job id"),
    ],
)
def test_parse_job_id_refuses_zero_or_many(tmp_path, salloc_output, message):
    log = tmp_path / "salloc.log"
    log.write_text(salloc_output)
    proc = bash(f"as_parse_job_id {log}")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert message in proc.stderr


def test_gres_is_typed_when_the_runner_names_a_type():
    assert bash("as_gres h200 4").stdout == "gpu:h200:4"
    assert bash("as_gres '' 2").stdout == "gpu:2"


def test_the_cell_travels_as_one_variable_not_a_field_list():
    proc = bash("declare -p AS_CELL_FIELDS")
    assert proc.returncode != 0  # no hand-kept copy of the cell's fields in the launcher library
    env = {"PATH": os.environ["PATH"], CELL_ENV_VAR: '{"exp_name": "k"}', "TP": "4"}
    assert bash("as_export_list", env).stdout.split(",") == ["PATH", CELL_ENV_VAR]


def test_export_list_names_only_what_is_set_and_never_all():
    env = {
        "PATH": os.environ["PATH"],
        "HOME": "/root",
        CELL_ENV_VAR: '{"exp_name": "k-tp1-ep1-u1-off"}',
        "HF_TOKEN": "hf_secret,with=odd chars",
        "AGENTSWEEP_CELL_SCRIPT": "/x.sh",
        "UNRELATED_SECRET": "nope",
    }
    proc = bash("as_export_list", env)
    names = proc.stdout.split(",")
    assert "HF_TOKEN" in names and CELL_ENV_VAR in names and "AGENTSWEEP_CELL_SCRIPT" in names
    assert "ALL" not in names and "UNRELATED_SECRET" not in names and "TP" not in names
    assert "hf_secret" not in proc.stdout and "=" not in proc.stdout
    assert len(names) == len(set(names))


def test_export_list_keeps_host_python_out_of_containers():
    env = {
        "PATH": os.environ["PATH"],
        "VIRTUAL_ENV": "/v",
        "AGENTSWEEP_PYTHON": "/v/bin/python",
        CELL_ENV_VAR: "{}",
    }
    on_host = bash("as_export_list", {**env, "AS_CONTAINER_RUNTIME": "none"}).stdout.split(",")
    assert {"VIRTUAL_ENV", "AGENTSWEEP_PYTHON", "PATH", CELL_ENV_VAR} <= set(on_host)
    for runtime in ("pyxis", "docker"):
        in_container = bash("as_export_list", {**env, "AS_CONTAINER_RUNTIME": runtime}).stdout.split(",")
        assert "VIRTUAL_ENV" not in in_container and "AGENTSWEEP_PYTHON" not in in_container
        assert CELL_ENV_VAR in in_container


@pytest.mark.parametrize(
    ("image", "uri"),
    [
        ("vllm/vllm-openai:v0.21.0", "docker://vllm/vllm-openai:v0.21.0"),
        ("ubuntu", "docker://ubuntu"),
        ("nvcr.io/nvidia/pytorch:25.01-py3", "docker://nvcr.io#nvidia/pytorch:25.01-py3"),
        ("localhost:5000/team/img:1", "docker://localhost:5000#team/img:1"),
    ],
)
def test_enroot_uri_marks_the_registry(image, uri):
    assert bash(f"as_enroot_uri {shlex.quote(image)}").stdout == uri


def fake_enroot(tmp_path: Path, fail: bool = False) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    enroot = bin_dir / "enroot"
    body = "exit 1" if fail else 'sleep 0.5; echo squash >"$3"'
    enroot.write_text(f'#!/usr/bin/env bash\necho "$*" >>"{tmp_path}/enroot.calls"\n{body}\n')
    enroot.chmod(enroot.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_squash_import_runs_once_under_concurrency(tmp_path):
    env = fake_enroot(tmp_path)
    sqsh = tmp_path / "squash" / "img.sqsh"
    script = f"as_import_squash nvcr.io/nvidia/img:1 {sqsh}"
    procs = [
        subprocess.Popen(
            ["bash", "-c", f"source {LIB}/common.sh; source {LIB}/container.sh; {script}"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.wait(timeout=30) == 0
    calls = (tmp_path / "enroot.calls").read_text().splitlines()
    assert len(calls) == 1
    assert calls[0].startswith("import --output ") and calls[0].endswith(" docker://nvcr.io#nvidia/img:1")
    assert sqsh.read_text() == "squash\n"
    assert not list(sqsh.parent.glob("*.partial.*"))


def test_the_import_records_the_digest_it_was_given_beside_the_squash_file(tmp_path):
    from agentsweep.images.local import squash_digest

    env = fake_enroot(tmp_path)
    sqsh = tmp_path / "squash" / "img.sqsh"
    digest = "sha256:" + "c" * 64
    assert bash(f"as_import_squash vllm/vllm-openai:v1 {sqsh} {digest}", env).returncode == 0
    assert squash_digest(sqsh) == digest
    # Already there: neither the file nor its digest changes.
    assert bash(f"as_import_squash vllm/vllm-openai:v1 {sqsh} sha256:{'d' * 64}", env).returncode == 0
    assert squash_digest(sqsh) == digest
    assert len((tmp_path / "enroot.calls").read_text().splitlines()) == 1
    # Imported without a known digest (the registry could not be asked): none is recorded.
    other = tmp_path / "squash" / "other.sqsh"
    assert bash(f"as_import_squash vllm/vllm-openai:v2 {other}", env).returncode == 0
    assert other.is_file() and squash_digest(other) is None


def test_failed_squash_import_leaves_no_file(tmp_path):
    env = fake_enroot(tmp_path, fail=True)
    sqsh = tmp_path / "squash" / "img.sqsh"
    proc = bash(f"as_import_squash vllm/vllm-openai:v1 {sqsh}", env)
    assert proc.returncode == 1
    assert not sqsh.exists() and not list(sqsh.parent.glob("*.partial.*"))


# --- the Python helper ------------------------------------------------------------------------


def test_time_limit_is_duration_plus_margins():
    assert time_limit_min(3600, "vllm", {}, 240) == 95  # 3600 + 1800 + 300 s
    assert time_limit_min(20, "sim", {}, 240) == 8  # 20 + 120 + 300 s, rounded up
    assert time_limit_min(0, "vllm", {}, 240) == 240  # no duration: the runner's default
    env = {"AGENTSWEEP_STARTUP_MARGIN_S": "60", "AGENTSWEEP_DRAIN_MARGIN_S": "0"}
    assert time_limit_min(61, "vllm", env, 240) == 3


def test_memory_covers_the_offload_budget():
    assert mem_gb(0.0, {}) == 0
    assert mem_gb(192.5, {}) == 193 + 32
    assert mem_gb(10, {"AGENTSWEEP_MEM_OVERHEAD_GB": "0"}) == 10


ALLOC_CELL = Cell(
    exp_name="k-tp4-ep1-u8-off",
    runner="b200",
    engine="vllm",
    model="m",
    image="img:1",
    tp=4,
    users=8,
    offload="off",
    duration=600,
    traces="/data/traces",
)


def test_allocation_prints_quoted_assignments(tmp_path, make_runners, monkeypatch, capsys):
    runners = make_runners(tmp_path / "runners.yaml")
    monkeypatch.setenv(CELL_ENV_VAR, ALLOC_CELL.to_json())
    monkeypatch.setenv("RESULT_DIR", str(tmp_path / "r"))
    assert allocation_main(["b200", "--runners", str(runners)]) == 0
    values = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert values["AS_GRES_TYPE"] == "b200" and values["AS_PARTITION"] == "b200"
    # 600 s replay + 600 s accuracy gate + 1800 s start-up + 300 s drain = 55 min
    assert values["AS_GPUS"] == "4" and values["AS_TIME_LIMIT_MIN"] == "55"
    assert values["AS_ACCOUNT"] == "''" and values["AS_MEM_GB"] == "0"
    assert values["AS_EXP_NAME"] == "k-tp4-ep1-u8-off" and values["AS_IMAGE"] == "img:1"
    assert values["AS_TRACES"] == "/data/traces"


@pytest.mark.parametrize(
    ("runner", "cell", "message"),
    [
        ("h999", ALLOC_CELL.to_json(), "no runner 'h999' (known: b200, h200, mi355x)"),
        (
            "b200",
            ALLOC_CELL.to_json().replace('"gpus":4', '"gpus":"two"'),
            "input error: $AGENTSWEEP_CELL.gpus: expected an integer, got 'two'",
        ),
        ("h200", ALLOC_CELL.to_json(), "cell.runner: 'b200' but this is the 'h200' launcher"),
        ("b200", None, f"environment variable {CELL_ENV_VAR} is not set"),
    ],
)
def test_allocation_bad_input_is_one_line_exit_2(
    tmp_path, make_runners, monkeypatch, capsys, runner, cell, message
):
    runners = make_runners(tmp_path / "runners.yaml")
    monkeypatch.delenv(CELL_ENV_VAR, raising=False)
    monkeypatch.setenv("RESULT_DIR", str(tmp_path))
    if cell is not None:
        monkeypatch.setenv(CELL_ENV_VAR, cell)
    assert allocation_main([runner, "--runners", str(runners)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# --- whole launchers in dry-run mode (no Slurm needed) -------------------------------------


def dry_run(runner: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**env, "AGENTSWEEP_DRY_RUN": "1"}
    return subprocess.run(
        ["bash", str(REPO / "runners" / f"launch_{runner}.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def pyxis_runners(path: Path, hf_cache: Path) -> Path:
    path.write_text(
        "h200: {runs_on: [self-hosted], launcher: runners/launch_h200.sh, gpus_per_node: 8, gres_type: h200,"
        " cpu_dram_gb: 1536, partition: gpu-h200, account: bench, time_limit_min: 240,"
        f" exclude: [node7, node9], container_runtime: pyxis, hf_cache: {json.dumps(str(hf_cache))}}}\n"
        "mi355x: {runs_on: [self-hosted], launcher: runners/launch_mi355x.sh, gpus_per_node: 8,"
        " gres_type: mi355x, cpu_dram_gb: 2304, partition: amd, time_limit_min: 240,"
        f" container_runtime: docker, hf_cache: {json.dumps(str(hf_cache))}}}\n"
    )
    return path


def test_pyxis_dry_run_shows_allocation_import_and_container(tmp_path, cell_env):
    runners = pyxis_runners(tmp_path / "runners.yaml", tmp_path / "hf")
    env = cell_env("h200", runners, tp=4, duration=600, image="vllm/vllm-openai:v0.21.0")
    env.update(HF_TOKEN="hf_dry_secret", AGENTSWEEP_SQUASH_DIR=str(tmp_path / "sq"))
    proc = dry_run("h200", env)
    assert proc.returncode == 0, proc.stderr
    salloc, comment, enroot, srun = proc.stdout.splitlines()
    assert salloc.startswith("salloc --no-shell ")
    # --time: 600 s of replay + 120 s start-up (engine sim) + 300 s drain = 17 min.
    for part in ("--gres=gpu:h200:4", "--time=17", "--partition=gpu-h200", "--account=bench"):
        assert part in shlex.split(salloc)
    assert "--exclude=node7,node9" in shlex.split(salloc)
    sqsh = tmp_path / "sq" / "vllm_vllm-openai_v0.21.0.sqsh"
    assert "flock" in comment
    assert enroot == f"enroot import --output {sqsh} docker://vllm/vllm-openai:v0.21.0"
    words = shlex.split(srun)
    assert f"--container-image={sqsh}" in words
    mounts = next(w for w in words if w.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    assert f"{REPO}:{REPO}" in mounts and f"{tmp_path / 'hf'}:{tmp_path / 'hf'}" in mounts
    assert f"{env['RESULT_DIR']}:{env['RESULT_DIR']}" in mounts
    exported = next(w for w in words if w.startswith("--export=")).split("=", 1)[1].split(",")
    assert {"HF_TOKEN", "HF_HUB_CACHE", CELL_ENV_VAR, "RESULT_DIR"} <= set(exported)
    assert "hf_dry_secret" not in proc.stdout + proc.stderr


def test_docker_dry_run_shows_the_named_container(tmp_path, cell_env):
    runners = pyxis_runners(tmp_path / "runners.yaml", tmp_path / "hf")
    env = cell_env("mi355x", runners, tp=8, image="rocm/vllm:latest")
    proc = dry_run("mi355x", env)
    assert proc.returncode == 0, proc.stderr
    docker = shlex.split(proc.stdout.splitlines()[-1])
    assert docker[:2] == ["docker", "run"]
    assert docker[docker.index("--name") + 1] == f"agentsweep-{Cell.parse(env[CELL_ENV_VAR]).exp_name}-JOBID"
    assert "/dev/kfd" in docker and "/dev/dri" in docker and "video" in docker
    assert docker[-3:] == ["rocm/vllm:latest", "bash", str(REPO / "benchmarks" / "run_cell.sh")]


def test_container_runtime_without_image_is_refused(tmp_path, cell_env):
    runners = pyxis_runners(tmp_path / "runners.yaml", tmp_path / "hf")
    proc = dry_run("h200", cell_env("h200", runners, tp=1))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "launch[h200]: cell IMAGE is empty but runner h200 runs cells in pyxis"


def test_bad_runners_file_is_one_line_exit_2(tmp_path, cell_env, make_runners):
    env = cell_env("h200", make_runners(tmp_path / "runners.yaml"), tp=1)
    bad = tmp_path / "bad.yaml"
    bad.write_text("h200: {gpus_per_node: 8}\n")
    env["AGENTSWEEP_RUNNERS"] = str(bad)
    proc = dry_run("h200", env)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "bad.yaml" in proc.stderr


@pytest.mark.parametrize("where", ["hf_cache", "result_dir", "traces"])
@pytest.mark.parametrize(("runner", "sep"), [("h200", ","), ("h200", ":"), ("mi355x", ":"), ("mi355x", ",")])
def test_a_comma_or_colon_never_reaches_the_container_mounts(tmp_path, cell_env, where, runner, sep):
    """pyxis splits --container-mounts at commas and colons: such a path is refused in one line, exit 2."""
    odd = tmp_path / f"x{sep}{tmp_path}"  # with the separator, this would mount the whole tmp_path
    odd.mkdir(parents=True)
    hf = odd if where == "hf_cache" else tmp_path / "hf"
    env = cell_env(runner, pyxis_runners(tmp_path / "runners.yaml", hf), tp=1, image="vllm/vllm-openai:v1")
    if where == "result_dir":
        env["RESULT_DIR"] = str(odd / "r")
    if where == "traces":
        cell = json.loads(env[CELL_ENV_VAR])
        env[CELL_ENV_VAR] = json.dumps({**cell, "traces": str(odd)})
    proc = dry_run(runner, env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"launch[{runner}]: cannot mount '{odd if where != 'result_dir' else odd / 'r'}' into the container: "
        "the path contains a comma or colon (rename it)"
    ]


@pytest.mark.parametrize("runner", ["h200", "mi355x"])
def test_a_newline_in_result_dir_never_adds_a_container_mount(tmp_path, cell_env, runner):
    """A RESULT_DIR with a newline would be two mount lines (the second one any path): refused, exit 2."""
    odd = tmp_path / f"r\n{tmp_path}"
    runners = pyxis_runners(tmp_path / "runners.yaml", tmp_path / "hf")
    env = cell_env(runner, runners, tp=1, image="vllm/vllm-openai:v1")
    env["RESULT_DIR"] = str(odd)
    proc = dry_run(runner, env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    shown = str(odd).replace("\n", "?")
    assert proc.stderr.strip().splitlines() == [
        f"launch[{runner}]: cannot mount '{shown}' into the container: "
        "the path contains a newline or another control character (rename it)"
    ]


def test_a_cell_that_never_ran_is_marked_failed_through_the_owner_and_its_own_verdict_is_kept(tmp_path):
    """as_mark_failed writes status.txt with the owner's writer (one line per reason: a two-line refusal
    is folded), and leaves a verdict the cell wrote itself as it is."""
    from agentsweep.contract.resultdir import read_status

    fresh, ran = tmp_path / "fresh", tmp_path / "ran"
    ran.mkdir()
    (ran / "status.txt").write_text("FAILED\nengine exited with status 1\n")
    script = f"source {LIB}/launch.sh; AS_REPO={REPO}; "
    for result_dir in (fresh, ran):
        proc = bash(
            script
            + f"RESULT_DIR={shlex.quote(str(result_dir))} as_mark_failed $'allocation refused: no\\nnodes'"
        )
        assert proc.returncode == 0, proc.stderr
    assert (fresh / "status.txt").read_text() == "FAILED\nallocation refused: no nodes\n"
    status = read_status(fresh)
    assert status is not None and status.reasons == ("allocation refused: no nodes",)
    assert (ran / "status.txt").read_text() == "FAILED\nengine exited with status 1\n"
    # A folder it cannot write to: one line, and the launcher goes on to say why it stopped.
    (tmp_path / "file").write_text("")
    proc = bash(script + f"RESULT_DIR={tmp_path / 'file'} as_mark_failed 'allocation refused'")
    assert proc.returncode == 0
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"write error: {tmp_path / 'file' / 'status.txt'}: cannot write: "), line
