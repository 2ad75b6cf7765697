"""configs/images.lock.yaml: the manifest digest of every image a shipped config names, by reference.

The lock sits beside the sweep configs and maps each ``image:`` value exactly as the configs write it
(``vllm/vllm-openai:v0.33.0``) to the digest its registry gave (``sha256:...``). ``agentsweep images
lock`` writes it; the matrix reads it, so every cell carries its image's ``image_digest``. An image
written with its digest (``repo:tag@sha256:...``) is pinned by the config itself and needs no entry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agentsweep.config.loader import display_path, read_config_file, read_yaml
from agentsweep.contract.errors import brief
from agentsweep.errors import ConfigError
from agentsweep.images.reference import inline_digest, is_digest

LOCK_FILE = "images.lock.yaml"
# Files of configs/ that are not sweep configs.
NOT_SWEEPS = frozenset({"runners.yaml", LOCK_FILE})
HEADER = """\
# The manifest digest of every image configs/*.yaml names, keyed by the image as written there (a
# multi-arch image's index digest). Written by `agentsweep images lock` (weekly by the images-lock
# workflow, as a pull request); the matrix gives each cell its image's digest from here, and preflight
# and the cell refuse a copy of the image whose digest differs (docs/first-run.md).
"""


def lock_path(config_dir: Path) -> Path:
    return config_dir / LOCK_FILE


def read_lock(path: Path) -> dict[str, str]:
    """The pins of ``path`` (none when the file does not exist); ConfigError naming the entry when one
    is not an image mapped to a sha256 digest."""
    if not os.path.lexists(path):
        return {}
    shown = display_path(path)
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: expected a mapping of image: sha256:DIGEST, got {brief(data)}")
    pins: dict[str, str] = {}
    for image, digest in data.items():
        if not isinstance(image, str) or not image or "@" in image:
            raise ConfigError(f"{shown}:{brief(image)}: keys are images as the configs write them (repo:tag)")
        if not isinstance(digest, str) or not is_digest(digest):
            raise ConfigError(f"{shown}:{image}: expected sha256:<64 hex digits>, got {brief(digest)}")
        pins[image] = digest
    return pins


def render_lock(pins: Mapping[str, str]) -> str:
    lines = [HEADER.rstrip("\n")]
    lines += [f'"{image}": "{pins[image]}"' for image in sorted(pins)] or ["{}"]
    return "\n".join(lines) + "\n"


def write_lock(path: Path, pins: Mapping[str, str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render_lock(pins), encoding="utf-8")
    os.replace(tmp, path)


@dataclass(frozen=True)
class ShippedImage:
    """An image the configs name by tag, and where (``agentic.yaml:dsr1-fp4-b200-vllm``...)."""

    image: str
    where: tuple[str, ...]


def config_files(config_dir: Path) -> list[Path]:
    """The sweep configs of ``config_dir`` (its *.yaml but runners.yaml and the lock), sorted."""
    return sorted(p for p in config_dir.glob("*.yaml") if p.name not in NOT_SWEEPS)


def shipped_images(config_dir: Path) -> list[ShippedImage]:
    """Every image the sweep configs of ``config_dir`` name by tag (those written with a digest are
    pinned already), sorted."""
    found: dict[str, list[str]] = {}
    for path in config_files(config_dir):
        config = read_config_file(path)
        for key, entry in config.entries.items():
            image = entry.get("image") if isinstance(entry, dict) else None
            if isinstance(image, str) and image and not inline_digest(image):
                found.setdefault(image, []).append(f"{path.name}:{key}")
    return [ShippedImage(image, tuple(where)) for image, where in sorted(found.items())]


def pinned_digest(image: str, pins: Mapping[str, str]) -> str:
    """The digest ``image`` is pinned to: the one written into it, else the lock's, else ""."""
    return inline_digest(image) or pins.get(image, "")
