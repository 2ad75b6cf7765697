"""The image check against a real registry (Debian's docker-registry, the distribution registry) on
loopback: an image pushed to it is found with its digest, a tag it lacks fails with the fix."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentsweep.preflight.container import ImageRef, image_check

pytestmark = pytest.mark.slow

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running docker-registry on 127.0.0.1; yields its host:port."""
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.skip("docker-registry not installed (apt-get install docker-registry)")
    root = tmp_path_factory.mktemp("registry")
    port = _free_port()
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nlog: {{level: error}}\nstorage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n"
    )
    proc = subprocess.Popen([exe, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    pytest.fail(f"docker-registry did not start: {err[-300:]}")
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _blob(host: str, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = urllib.request.Request(f"http://{host}/v2/{repo}/blobs/uploads/", method="POST", data=b"")
    with urllib.request.urlopen(start) as resp:
        location = resp.headers["Location"]
    url = location if location.startswith("http") else f"http://{host}{location}"
    sep = "&" if "?" in url else "?"
    put = urllib.request.Request(
        f"{url}{sep}digest={digest}",
        method="PUT",
        data=data,
        headers={"Content-Type": "application/octet-stream"},
    )
    urllib.request.urlopen(put).close()
    return digest


def push_tiny_image(host: str, repo: str, tag: str) -> str:
    """Push a one-file image through the registry API; returns its manifest digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"hello\n"))
    layer = gzip.compress(buf.getvalue(), mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(buf.getvalue()).hexdigest()],
            },
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(config),
                "digest": _blob(host, repo, config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": len(layer),
                    "digest": _blob(host, repo, layer),
                }
            ],
        }
    ).encode()
    put = urllib.request.Request(
        f"http://{host}/v2/{repo}/manifests/{tag}",
        method="PUT",
        data=manifest,
        headers={"Content-Type": MANIFEST_V2},
    )
    urllib.request.urlopen(put).close()
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def test_image_references_split_like_docker() -> None:
    assert ImageRef.parse("vllm/vllm-openai:v0.33.0") == ImageRef(
        "registry-1.docker.io", "vllm/vllm-openai", "v0.33.0"
    )
    assert ImageRef.parse("ubuntu") == ImageRef("registry-1.docker.io", "library/ubuntu", "latest")
    ref = ImageRef.parse("nvcr.io/nvidia/pytorch:25.01-py3@sha256:abc")
    assert (ref.registry, ref.repository, ref.reference) == ("nvcr.io", "nvidia/pytorch", "sha256:abc")
    assert ImageRef.parse("127.0.0.1:5000/a/b:c").base_url == "http://127.0.0.1:5000"


def test_a_pushed_image_passes_with_its_digest(registry: str, tmp_path: Path) -> None:
    digest = push_tiny_image(registry, "agentsweep/tiny", "v1")
    image = f"{registry}/agentsweep/tiny:v1"
    check = image_check(image, "pyxis", {"AGENTSWEEP_SQUASH_DIR": str(tmp_path)}, lambda argv: (127, ""))
    assert check.status == "PASS", check
    assert digest in check.detail and f"image: {image}@{digest}" in check.detail
    pinned = image_check(
        f"{image}@{digest}", "pyxis", {"AGENTSWEEP_SQUASH_DIR": str(tmp_path)}, lambda argv: (127, "")
    )
    assert pinned.status == "PASS" and "pin it" not in pinned.detail


def test_a_missing_image_fails_with_the_fix(registry: str, tmp_path: Path) -> None:
    image = f"{registry}/agentsweep/tiny:no-such-tag"
    check = image_check(
        image, "docker", {"AGENTSWEEP_SQUASH_DIR": str(tmp_path)}, lambda argv: (1, "No such image")
    )
    assert check.status == "FAIL"
    assert "has no agentsweep/tiny:no-such-tag" in check.detail
    assert "check the tag exists" in check.fix


def test_an_imported_squash_file_counts_as_present(registry: str, tmp_path: Path) -> None:
    image = f"{registry}/agentsweep/never-pushed:v1"
    sqsh = tmp_path / (image.replace("/", "_").replace(":", "_") + ".sqsh")
    sqsh.write_bytes(b"hsqs")
    check = image_check(image, "pyxis", {"AGENTSWEEP_SQUASH_DIR": str(tmp_path)}, lambda argv: (127, ""))
    assert check.status == "PASS" and str(sqsh) in check.detail
