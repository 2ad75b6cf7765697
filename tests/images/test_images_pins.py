"""The lock file, how cells get their image digest, and the refusal of a copy that is not the pinned one
(no registry: the registry tests are in test_images_registry.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentsweep.config import select_cells
from agentsweep.config.image_lock import LOCK_FILE, read_lock, render_lock, shipped_images, write_lock
from agentsweep.contract.cell import Cell
from agentsweep.errors import ConfigError, InputError
from agentsweep.images.local import (
    DIGEST_ENV_VAR,
    ImageMismatch,
    image_record,
    mismatch,
    parse_digests,
    ran_digest,
    refuse_other_image,
)
from agentsweep.images.reference import ImageRef
from agentsweep.images.registry import RegistryAnswer, _challenge, mirror_map

REPO = Path(__file__).resolve().parents[2]
A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64

ENTRY = """\
{key}:
  engine: vllm
  runner: h200
  model: m
  precision: fp8
  image: {image}
  duration: 60
  traces: t
  search_space:
    tp1: {{users: [1, 2], offload: [off]}}
"""


def configs_with(tmp_path: Path, image: str, lock: str | None = None, extra: str = "") -> Path:
    configs = tmp_path / "configs"
    configs.mkdir(exist_ok=True)
    (configs / "sweep.yaml").write_text(ENTRY.format(key="k", image=image) + extra)
    if lock is not None:
        (configs / LOCK_FILE).write_text(lock)
    return configs / "sweep.yaml"


def test_every_cell_carries_the_digest_the_lock_gives_its_image(tmp_path):
    sweep = configs_with(tmp_path, "vllm/vllm-openai:v0.33.0", f'"vllm/vllm-openai:v0.33.0": "{A}"\n')
    cells = select_cells(sweep, ["k"])
    assert len(cells) == 2 and {c.image_digest for c in cells} == {A}


def test_an_image_written_with_its_digest_is_pinned_by_it_without_the_lock(tmp_path):
    sweep = configs_with(tmp_path, f"vllm/vllm-openai:v0.33.0@{B}")
    assert {c.image_digest for c in select_cells(sweep, ["k"])} == {B}


def test_an_image_the_lock_does_not_name_is_not_pinned(tmp_path):
    sweep = configs_with(tmp_path, "vllm/vllm-openai:v0.34.0", f'"vllm/vllm-openai:v0.33.0": "{A}"\n')
    assert {c.image_digest for c in select_cells(sweep, ["k"])} == {""}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            '"vllm/vllm-openai:v0.33.0": "sha256:abc"\n',
            "vllm/vllm-openai:v0.33.0: expected sha256:<64 hex digits>",
        ),
        (f'"vllm/vllm-openai:v0.33.0@{A}": "{A}"\n', "keys are images as the configs write them"),
        ("- a\n- b\n", "expected a mapping of image: sha256:DIGEST"),
        (f'"x:1": "{A}"\n"x:1": "{B}"\n', "duplicate key"),
    ],
)
def test_a_bad_lock_is_one_line_naming_the_entry(tmp_path, text, says):
    sweep = configs_with(tmp_path, "x:1", text)
    with pytest.raises(ConfigError) as err:
        select_cells(sweep, ["k"])
    assert LOCK_FILE in str(err.value) and says in str(err.value) and "\n" not in str(err.value)


def test_a_config_entry_cannot_set_the_digest_itself(tmp_path):
    sweep = configs_with(tmp_path, "x:1")
    sweep.write_text(sweep.read_text().replace("  duration: 60\n", f"  duration: 60\n  image_digest: {A}\n"))
    with pytest.raises(ConfigError, match="image_digest is not set in a config: `agentsweep images lock`"):
        select_cells(sweep, ["k"])


def test_a_cell_whose_digest_contradicts_its_image_is_refused():
    cell = {"exp_name": "c", "engine": "sim", "model": "m", "tp": 1, "users": 1, "offload": "off"}
    cell |= {"duration": 5, "traces": "t", "image": f"x/y:1@{A}", "image_digest": B}
    with pytest.raises(InputError, match="differs from the digest in image"):
        Cell.parse(cell)
    with pytest.raises(InputError, match="image_digest"):
        Cell.parse({**cell, "image": "x/y:1", "image_digest": "sha256:short"})
    assert Cell.parse({**cell, "image_digest": A}).image_digest == A


def test_the_lock_is_written_sorted_and_read_back(tmp_path):
    path = tmp_path / LOCK_FILE
    write_lock(path, {"z/z:1": A, "a/a:2": B})
    text = path.read_text()
    assert text.startswith("# The manifest digest of every image")
    assert text.index('"a/a:2"') < text.index('"z/z:1"')
    assert read_lock(path) == {"a/a:2": B, "z/z:1": A}
    write_lock(path, {})
    assert read_lock(path) == {} and render_lock({}).endswith("{}\n")


def test_the_shipped_lock_pins_only_images_the_shipped_configs_name():
    named = {s.image for s in shipped_images(REPO / "configs")}
    assert named  # the real engines' images
    assert set(read_lock(REPO / "configs" / LOCK_FILE)) <= named


def test_shipped_images_skips_images_pinned_in_the_config_and_names_where(tmp_path):
    sweep = configs_with(tmp_path, "x/y:1", extra=ENTRY.format(key="k2", image=f"x/z:1@{A}"))
    sweep.with_name("more.yaml").write_text(ENTRY.format(key="k3", image="x/y:1"))
    found = shipped_images(sweep.parent)
    assert [(s.image, s.where) for s in found] == [("x/y:1", ("more.yaml:k3", "sweep.yaml:k"))]


def test_mirrors_name_a_registry_and_a_host():
    assert mirror_map(["docker.io=127.0.0.1:5000", "nvcr.io=localhost:6000"]) == {
        "registry-1.docker.io": "127.0.0.1:5000",
        "nvcr.io": "localhost:6000",
    }
    for bad in ("docker.io", "=h:1", "docker.io=http://h/"):
        with pytest.raises(ValueError, match="expected REGISTRY=HOST"):
            mirror_map([bad])
    ref = ImageRef.parse("docker.io/vllm/vllm-openai:v1")
    assert ref == ImageRef.parse("vllm/vllm-openai:v1")
    assert ref.at("127.0.0.1:5000").base_url == "http://127.0.0.1:5000"
    assert ImageRef.parse("nvcr.io/nvidia/x:1").base_url == "https://nvcr.io"


def test_a_challenge_other_than_bearer_is_refused_in_one_line():
    fields = _challenge('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="s"')
    assert fields == {"realm": "https://auth.docker.io/token", "service": "registry.docker.io", "scope": "s"}
    for header, says in (
        ('Basic realm="x"', "asks for Basic authentication"),
        ("Bearer x", "names no token service"),
    ):
        with pytest.raises(RegistryAnswer, match=says) as err:
            _challenge(header)
        assert err.value.kind == "denied"


def test_a_copy_known_by_another_digest_is_refused_naming_both():
    assert parse_digests(f" {A} junk {B} {A}") == (A, B)
    assert mismatch("x:1", A, (A, B)) is None
    assert mismatch("x:1", "", (B,)) is None and mismatch("x:1", A, ()) is None
    said = mismatch("x:1", A, (B,))
    assert said and f"the copy here is {B}" in said and f"pins {A}" in said
    assert ran_digest(A, (B, A)) == A and ran_digest(A, (B,)) == B and ran_digest("", ()) is None
    with pytest.raises(ImageMismatch) as err:
        refuse_other_image("x:1", A, {DIGEST_ENV_VAR: B})
    assert err.value.exit_code == 2 and err.value.render().startswith("image refused: x:1:")
    refuse_other_image("x:1", A, {})  # no container: nothing to compare
    refuse_other_image("x:1", A, {DIGEST_ENV_VAR: ""})  # a copy of unknown digest (imported by hand)
    assert image_record({"image_digest": A}, {DIGEST_ENV_VAR: f"{B} {A}"}) == {"image_digest": A}
    assert image_record({}, {}) == {}
