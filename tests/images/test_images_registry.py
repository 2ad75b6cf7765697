"""Images pinned by digest against a real registry on loopback (Debian's docker-registry): the lock
resolves every shipped image pushed under its shipped name, keeps a multi-arch image's index digest,
takes a bearer token when the registry asks for one, and a tag whose content changed after the lock is
refused by preflight and by the cell, both digests named."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.config import select_cells
from agentsweep.config.image_lock import LOCK_FILE, read_lock, shipped_images
from agentsweep.contract.cell import CELL_ENV_VAR
from agentsweep.images.local import DIGEST_ENV_VAR, mismatch
from agentsweep.preflight.container import image_check

from tests.support import free_port, stop_process, wait_for_http
from tests.support.registry import NoRegistry, push_multi_arch, push_tiny_image, running_registry

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NO_COMMAND = lambda argv: (127, "")  # noqa: E731  (no docker here: the registry is asked)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        with running_registry(tmp_path_factory.mktemp("registry")) as host:
            yield host
    except NoRegistry as why:
        pytest.skip(str(why))


def shipped_configs(tmp_path: Path) -> Path:
    """A copy of the repository's sweep configs (no lock yet)."""
    configs = tmp_path / "configs"
    configs.mkdir()
    for path in (REPO / "configs").glob("*.yaml"):
        if path.name != LOCK_FILE:
            shutil.copy(path, configs / path.name)
    return configs


def lock(capsys: pytest.CaptureFixture[str], configs: Path, *mirrors: str) -> tuple[int, str, str]:
    code = main(
        ["images", "lock", "--config-dir", str(configs), *(a for m in mirrors for a in ("--mirror", m))]
    )
    out, err = capsys.readouterr()
    return code, out, err


def test_the_lock_pins_every_shipped_image_pushed_under_its_shipped_name(registry, tmp_path, capsys):
    configs = shipped_configs(tmp_path)
    images = shipped_images(configs)
    assert {s.image for s in images} == {
        "vllm/vllm-openai:v0.33.0",
        "vllm/vllm-openai-rocm:v0.33.0",
        "lmsysorg/sglang:v0.5.23",
    }
    pushed = {}
    for shipped in images:
        repo, _, tag = shipped.image.rpartition(":")
        pushed[shipped.image] = push_tiny_image(registry, repo, tag, shipped.image.encode())
    code, out, err = lock(capsys, configs, f"docker.io={registry}")
    assert code == 0, err
    assert read_lock(configs / LOCK_FILE) == pushed
    assert all(f"{image} {digest} (new)" in out for image, digest in pushed.items())
    # Every cell of a shipped key carries its image's digest from the lock.
    cells = select_cells(configs / "agentic.yaml", ["*-vllm", "*-sglang"])
    assert cells and all(c.image_digest == pushed[c.image] for c in cells)
    assert {c.image for c in cells} == set(pushed)
    # Nothing moved: the file is left as it is.
    before = (configs / LOCK_FILE).read_bytes()
    code, out, _ = lock(capsys, configs, f"docker.io={registry}")
    assert code == 0 and "up to date (3 images)" in out
    assert (configs / LOCK_FILE).read_bytes() == before


def test_a_multi_arch_image_is_pinned_by_its_index_digest(registry, tmp_path, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    index, platforms = push_multi_arch(registry, "agentsweep/multi", "v2")
    (configs / "multi.yaml").write_text(
        "multi:\n  engine: vllm\n  runner: h200\n  model: m\n  precision: fp8\n"
        f"  image: {registry}/agentsweep/multi:v2\n  duration: 60\n  traces: t\n"
        "  search_space:\n    tp1: {users: 1, offload: [off]}\n"
    )
    code, _, err = lock(capsys, configs)
    assert code == 0, err
    assert read_lock(configs / LOCK_FILE) == {f"{registry}/agentsweep/multi:v2": index}
    assert index not in platforms


def test_a_moved_tag_is_refused_by_preflight_naming_both_digests(registry, tmp_path, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    image = f"{registry}/agentsweep/moving:v1"
    (configs / "moving.yaml").write_text(sim_entry(image))
    first = push_tiny_image(registry, "agentsweep/moving", "v1", b"first\n")
    assert lock(capsys, configs)[0] == 0
    (cell,) = select_cells(configs / "moving.yaml", ["moving"])
    assert cell.image_digest == first
    env = {"AGENTSWEEP_SQUASH_DIR": str(tmp_path / "squash")}
    assert image_check(image, "docker", env, NO_COMMAND, cell.image_digest).status == "PASS"

    second = push_tiny_image(registry, "agentsweep/moving", "v1", b"second\n")
    check = image_check(image, "docker", env, NO_COMMAND, cell.image_digest)
    assert check.status == "FAIL"
    assert f"the registry gives {second}, the pin is {first}" in check.detail
    assert "agentsweep images lock" in check.fix
    # The same through `agentsweep preflight`: one FAIL line naming both, exit 2.
    runners = tmp_path / "runners.yaml"
    runners.write_text(
        "local:\n  runs_on: [self-hosted]\n  launcher: runners/launch_local.sh\n  gpus_per_node: 1\n"
        "  cpu_dram_gb: 0\n  container_runtime: docker\n  hardware: h200\n"
    )
    code = main(
        ["preflight", "--config", str(configs / "moving.yaml"), "--runners", str(runners), "--key", "moving"]
    )
    out = capsys.readouterr().out
    assert code == 2
    assert any(
        line.startswith("FAIL  container.image") and first in line and second in line
        for line in out.splitlines()
    )
    # Moving the pin (the lock run again) makes the new content the pinned one.
    code, out, _ = lock(capsys, configs)
    assert code == 0 and f"{second} (moved from {first})" in out
    (cell,) = select_cells(configs / "moving.yaml", ["moving"])
    assert image_check(image, "docker", env, NO_COMMAND, cell.image_digest).status == "PASS"


def test_a_registry_without_the_image_leaves_the_lock_as_it_was(registry, tmp_path, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "gone.yaml").write_text(sim_entry(f"{registry}/agentsweep/never-pushed:v9"))
    (configs / LOCK_FILE).write_text("{}\n")
    code, _, err = lock(capsys, configs)
    assert code == 2
    assert err.count("\n") == 1 and "has no agentsweep/never-pushed:v9" in err and "left as it was" in err
    assert (configs / LOCK_FILE).read_text() == "{}\n"


def sim_entry(image: str, key: str = "moving", traces: str = "kv-cache-tester/sample_traces") -> str:
    return (
        f"{key}:\n  engine: sim\n  runner: local\n  model: meta-llama/Llama-3.3-70B-Instruct\n"
        f"  precision: fp8\n  image: {image}\n  duration: 4\n  speed: 50\n  traces: {traces}\n"
        "  engine_args: [--num-gpu-blocks-override, '4096']\n"
        "  replay: {max_context: 65536, max_delay: 1, warmup_requests: 0}\n"
        "  validity: {min_window_coverage: 0.5, max_dispatch_lag_p99_s: 2.0}\n"
        "  search_space:\n    tp1: {users: 2, offload: [off]}\n"
    )


# --- the cell ----------------------------------------------------------------------------------


def run_cell(cell_json: str, result_dir: Path, digests: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    env.update({CELL_ENV_VAR: cell_json, "RESULT_DIR": str(result_dir), DIGEST_ENV_VAR: digests})
    return subprocess.run(
        [str(REPO / "benchmarks" / "run_cell.sh"), "--health-timeout", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cell_refuses_a_copy_that_is_not_the_pinned_one_and_records_what_ran(registry, tmp_path, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "moving.yaml").write_text(
        sim_entry(
            f"{registry}/agentsweep/cellimage:v1", traces=str(REPO / "kv-cache-tester" / "sample_traces")
        )
    )
    pinned = push_tiny_image(registry, "agentsweep/cellimage", "v1", b"pinned\n")
    assert lock(capsys, configs)[0] == 0
    (cell,) = select_cells(configs / "moving.yaml", ["moving"])
    other = push_tiny_image(registry, "agentsweep/cellimage", "v1", b"other\n")

    refused = run_cell(cell.to_json(), tmp_path / "refused", other)
    assert refused.returncode == 2, refused.stderr
    status = (tmp_path / "refused" / "status.txt").read_text().splitlines()
    assert status[0] == "FAILED" and other in status[1] and pinned in status[1]
    record = json.loads((tmp_path / "refused" / "cell.json").read_text())
    assert record["image_digest"] == other and record["cell"]["image_digest"] == pinned
    assert not (tmp_path / "refused" / "server.log").exists()  # no engine was started

    ran = run_cell(cell.to_json(), tmp_path / "ran", f"{other} {pinned}")  # podman keeps index and platform
    assert ran.returncode in (0, 1), ran.stderr
    assert (tmp_path / "ran" / "status.txt").read_text().splitlines()[0] in ("SUCCESS", "INVALID")
    assert json.loads((tmp_path / "ran" / "cell.json").read_text())["image_digest"] == pinned


# --- token authentication ----------------------------------------------------------------------


@contextlib.contextmanager
def token_gate(upstream: str, tmp_path: Path, *flags: str) -> Iterator[tuple[str, Path]]:
    """tests/support/token_gate.py in front of ``upstream``: yields its host:port and the file its token
    service logs each query to."""
    port, log = free_port(), tmp_path / "token-queries.jsonl"
    argv = [sys.executable, str(REPO / "tests" / "support" / "token_gate.py"), "--upstream", upstream]
    proc = subprocess.Popen([*argv, "--port", str(port), "--log", str(log), *flags], stderr=subprocess.PIPE)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/v2/", timeout=20, status=401, process=proc)
        yield f"127.0.0.1:{port}", log
    finally:
        stop_process(proc)


def test_the_lock_takes_a_bearer_token_when_the_registry_asks_for_one(registry, tmp_path, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "agentic.yaml").write_text(sim_entry("vllm/vllm-openai:v0.33.0", key="hub"))
    digest = push_tiny_image(registry, "vllm/vllm-openai", "v0.33.0", b"hub\n")
    with token_gate(registry, tmp_path) as (gate, log):
        code, _, err = lock(capsys, configs, f"docker.io={gate}")
    assert code == 0, err
    assert read_lock(configs / LOCK_FILE) == {"vllm/vllm-openai:v0.33.0": digest}
    asked = [json.loads(line) for line in log.read_text().splitlines()]
    assert asked == [{"service": "loopback-registry", "scope": "repository:vllm/vllm-openai:pull"}]


def test_a_refused_token_is_one_line_and_the_lock_stays(registry, tmp_path, capsys):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "agentic.yaml").write_text(sim_entry("vllm/vllm-openai:v0.33.0", key="hub"))
    with token_gate(registry, tmp_path, "--refuse-tokens") as (gate, _):
        code, _, err = lock(capsys, configs, f"docker.io={gate}")
    assert code == 2
    assert err.count("\n") == 1 and f"the token service http://{gate}/token answered HTTP 401" in err
    assert not (configs / LOCK_FILE).exists()


# --- a node's docker image store (podman as `docker`) --------------------------------------------


@pytest.fixture
def podman_as_docker(registry: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment whose `docker` is podman (as Debian's podman-docker makes it) and which pulls from
    the loopback registry over plain HTTP."""
    if shutil.which("podman") is None:
        pytest.skip("podman not installed (apt-get install podman)")
    conf = tmp_path / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "docker"
    shim.write_text(f'#!/bin/sh\nexport CONTAINERS_REGISTRIES_CONF="{conf}"\nexec podman "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    yield env


def docker_digests_here(image: str, env: dict[str, str]) -> list[str]:
    """What step.sh hands the cell: runners/lib/container.sh's as_docker_digests."""
    lib = REPO / "runners" / "lib"
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'source {lib}/common.sh; source {lib}/container.sh; as_docker_digests "$1"',
            "_",
            image,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def _run_with(env: dict[str, str]) -> Callable[[Sequence[str]], tuple[int, str]]:
    """preflight's command runner, with ``env``'s PATH (its `docker`)."""

    def run(argv: Sequence[str]) -> tuple[int, str]:
        proc = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=120, check=False)
        return proc.returncode, proc.stdout + proc.stderr

    return run


def test_a_stale_copy_in_the_docker_store_is_refused_after_the_tag_moved(
    registry, podman_as_docker, tmp_path
):
    image = f"{registry}/agentsweep/node-copy:v1"
    first = push_tiny_image(registry, "agentsweep/node-copy", "v1", b"first\n")
    try:
        assert first in docker_digests_here(image, podman_as_docker)  # pulled: the registry's digest
        second = push_tiny_image(registry, "agentsweep/node-copy", "v1", b"second\n")
        stale = docker_digests_here(image, podman_as_docker)  # the copy is there: not pulled again
        assert first in stale and second not in stale
        # The lock moved to the new content: the node's copy is refused by preflight, naming both...
        env = {"PATH": podman_as_docker["PATH"], "AGENTSWEEP_SQUASH_DIR": str(tmp_path)}
        check = image_check(image, "docker", env, _run_with(podman_as_docker), second)
        assert check.status == "FAIL", check
        assert first in check.detail and f"the pin is {second}" in check.detail
        assert f"docker rmi {image}" in check.fix
        # ... and by the cell, which records the copy it was given.
        assert mismatch(image, second, stale)
    finally:
        subprocess.run(["podman", "rmi", "--force", image], capture_output=True, timeout=120, check=False)
