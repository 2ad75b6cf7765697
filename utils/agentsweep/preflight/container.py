"""Container checks: the runtime the launcher uses answers, and the image is present or pullable.

The image is looked for where the launcher would take it from: the enroot squash file it imports once
(pyxis) or the local docker image store (docker); otherwise its registry is asked for the manifest
over the registry HTTP API (agentsweep.images.registry), which also gives its digest. A cell pinned to
a digest (configs/images.lock.yaml, or ``image: repo:tag@sha256:...``) fails the check when the copy
it would run is known by another digest (agentsweep.images.local), or when the registry's tag has
moved away from the pin and no pinned copy is at hand: both digests are named.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agentsweep.images.local import docker_digests, squash_digest
from agentsweep.images.reference import DOCKER_HUB, ImageRef
from agentsweep.images.registry import MANIFEST_TYPES, RegistryAnswer, manifest_digest
from agentsweep.preflight.node import Run, _last
from agentsweep.preflight.report import Check, failed, passed, skipped

__all__ = ["DOCKER_HUB", "MANIFEST_TYPES", "ImageRef", "RegistryAnswer", "image_check", "manifest_digest"]


def squash_path(image: str, environ: dict[str, str]) -> Path:
    """Where the launcher keeps the image's enroot squash file (runners/lib/container.sh as_squash_path)."""
    root = environ.get("AGENTSWEEP_SQUASH_DIR") or f"{environ.get('HOME') or '/tmp'}/.cache/agentsweep/squash"
    return Path(root) / (re.sub(r"[^A-Za-z0-9._-]", "_", image) + ".sqsh")


def runtime_check(runtime: str, runner: str, run: Run) -> Check:
    """On this host: pyxis shows in srun's options; docker's daemon answers."""
    name = "container.runtime"
    if runtime == "none":
        return skipped(name, f"runner {runner} runs cells without a container (container_runtime: none)")
    if runtime == "pyxis":
        status, text = run(["srun", "--help"])
        if status == 0 and "--container-image" in text:
            return passed(name, "pyxis: srun takes --container-image")
        return failed(
            name,
            "srun has no --container-image: pyxis is not installed here (or not in plugstack.conf)",
            f"install pyxis/enroot on the cluster, or set container_runtime of runner {runner} in configs/runners.yaml",
        )
    status, text = run(["docker", "version", "--format", "{{.Server.Version}}"])
    if status != 0:
        return failed(
            name,
            f"docker does not answer here ({_last(text)})",
            f"install docker (and start its daemon) where cells run, or set container_runtime of runner {runner}",
        )
    return passed(name, f"docker {_last(text)}")


def image_check(image: str, runtime: str, environ: dict[str, str], run: Run, pinned: str = "") -> Check:
    """The image is already where the launcher takes it from, or its registry has it (with its digest);
    a pinned image's copy and the registry's tag are the pinned digest (see the module's docstring)."""
    name = "container.image"
    if runtime == "none":
        return skipped(name, "no container: the engine runs from the host's installation")
    if not image:
        return failed(name, "the entry has no image", "set image: in the config entry (repo:tag)")
    local, drop = "", ""
    copy: tuple[str, ...] = ()  # the digests the copy at hand is known by
    if runtime == "pyxis":
        sqsh = squash_path(image, environ)
        if sqsh.is_file() and sqsh.stat().st_size > 0:
            recorded = squash_digest(sqsh)
            local, copy, drop = f"imported as {sqsh}", (recorded,) if recorded else (), f"rm {sqsh}"
    else:
        found = docker_digests(image, run)
        if found is not None:
            local, copy, drop = "in the local docker image store", found, f"docker rmi {image}"
    if local and pinned and copy and pinned not in copy:
        return failed(
            name,
            f"{image}: the copy {local} is {' or '.join(copy)}; the pin is {pinned}",
            f"remove the stale copy ({drop}) so the launcher takes the pinned one, or move the pin "
            "(`agentsweep images lock`)",
        )
    try:
        digest = manifest_digest(image)
    except RegistryAnswer as answer:
        if local:
            return passed(name, f"{image} {local} (registry not asked: {answer}){_pin_note(pinned, copy)}")
        fixes = {
            "missing": "correct image: in the config entry (check the tag exists), or push the image",
            "denied": "correct image: in the config entry, or log in to the registry where cells pull",
            "unreachable": "import the image once where the nodes can read it (enroot import / docker pull), or open the registry to this host",
        }
        return failed(name, f"{image}: not present here and {answer}", fixes[answer.kind])
    where = f"{local}; " if local else ""
    if pinned and digest != pinned:
        if pinned in copy:
            return passed(name, f"{image}: {where}pinned {pinned} (the registry's tag has moved to {digest})")
        return failed(
            name,
            f"{image}: the registry gives {digest}, the pin is {pinned}",
            "the tag moved: review the new image and move the pin (`agentsweep images lock`, or the "
            "images-lock workflow's pull request), or push the pinned image back under the tag",
        )
    if pinned:
        return passed(name, f"{image}: {where}registry digest {digest}, as pinned")
    hint = "" if "@" in image else f" (not pinned: `agentsweep images lock`, or image: {image}@{digest})"
    return passed(name, f"{image}: {where}registry digest {digest}{hint}")


def _pin_note(pinned: str, copy: tuple[str, ...]) -> str:
    if not pinned:
        return ""
    if pinned in copy:
        return f"; pinned {pinned}"
    return f"; pinned {pinned}, the copy's digest is not recorded"


def host_environ() -> dict[str, str]:
    return dict(os.environ)
