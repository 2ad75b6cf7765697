"""The image check against a real registry (Debian's docker-registry, the distribution registry) on
loopback: an image pushed to it is found with its digest, a tag it lacks fails with the fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agentsweep.preflight.container import ImageRef, image_check

from tests.support.registry import NoRegistry, push_tiny_image, running_registry

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running docker-registry on 127.0.0.1; yields its host:port."""
    try:
        with running_registry(tmp_path_factory.mktemp("registry")) as host:
            yield host
    except NoRegistry as why:
        pytest.skip(str(why))


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
