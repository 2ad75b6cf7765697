"""The digest of the copy of an image a node runs, and the refusal of a copy that is not the pinned one.

Where the launcher takes the image from decides how its digest is known:
- docker: the image store's ``RepoDigests`` (``docker image inspect``): the digests the copy was pulled
  by (podman also keeps a multi-arch index's platform manifest digest beside the index's);
- pyxis: the digest the launcher resolved just before it imported the squash file, kept beside it as
  ``<file>.sqsh.digest`` (enroot keeps none of its own); a squash file imported by hand has none.

The launcher hands the cell what it found in ``AGENTSWEEP_IMAGE_DIGEST`` (the digests, space
separated; empty when the copy's digest is unknown); the cell refuses to start when the cell is pinned
and the copy is known by other digests only, and records the digest in cell.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agentsweep.errors import InputError
from agentsweep.images.reference import is_digest

DIGEST_ENV_VAR = "AGENTSWEEP_IMAGE_DIGEST"
SIDECAR_SUFFIX = ".digest"
SIDECAR_MAX_BYTES = 4096

# A command runner: argv -> (exit status, output), as preflight runs commands.
Run = Callable[[Sequence[str]], tuple[int, str]]


class ImageMismatch(InputError):
    """The node's copy of the image is not the one the cell is pinned to. Message: both digests."""

    prefix = "image refused"


def docker_digests(image: str, run: Run) -> tuple[str, ...] | None:
    """The digests the docker image store knows ``image`` by; None when it does not hold it, () when it
    holds it without any (built or imported locally)."""
    status, text = run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image])
    if status != 0:
        return None
    try:
        listed = json.loads(text.strip().splitlines()[-1]) if text.strip() else []
    except ValueError:
        return ()
    digests = [str(item).rpartition("@")[2] for item in listed or [] if isinstance(item, str)]
    return tuple(dict.fromkeys(d for d in digests if is_digest(d)))


def sidecar(sqsh: Path) -> Path:
    return sqsh.with_name(sqsh.name + SIDECAR_SUFFIX)


def squash_digest(sqsh: Path) -> str | None:
    """The digest recorded beside an imported squash file, or None (imported by hand, or unreadable)."""
    try:
        with sidecar(sqsh).open("rb") as f:
            text = f.read(SIDECAR_MAX_BYTES).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if is_digest(text) else None


def parse_digests(text: str) -> tuple[str, ...]:
    """``AGENTSWEEP_IMAGE_DIGEST``'s digests (anything else in it is ignored)."""
    return tuple(dict.fromkeys(word for word in text.split() if is_digest(word)))


def mismatch(image: str, pinned: str, digests: Sequence[str]) -> str | None:
    """Why the copy known by ``digests`` is not ``image`` as pinned, or None (it is, or either side is
    unknown)."""
    if not pinned or not digests or pinned in digests:
        return None
    have = " or ".join(digests)
    return (
        f"{image}: the copy here is {have}, configs/images.lock.yaml pins {pinned} (the tag moved since "
        "the lock, or a stale copy is cached): pull or import it again, or move the pin with "
        "`agentsweep images lock`"
    )


def ran_digest(pinned: str, digests: Sequence[str]) -> str | None:
    """The digest the node ran, for cell.json: the pinned one when the copy is known by it, else the
    first the copy is known by; None when unknown."""
    if pinned and pinned in digests:
        return pinned
    return digests[0] if digests else None


def node_digests(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """What the launcher found (None: it ran no container, or said nothing)."""
    text = environ.get(DIGEST_ENV_VAR)
    return None if text is None else parse_digests(text)


def refuse_other_image(image: str, pinned: str, environ: Mapping[str, str]) -> None:
    """ImageMismatch when the launcher's copy of ``image`` is known, pinned, and not the pinned one."""
    digests = node_digests(environ)
    problem = mismatch(image, pinned, digests or ())
    if problem:
        raise ImageMismatch(problem)


def image_record(cell: Mapping[str, object], environ: Mapping[str, str]) -> dict[str, str]:
    """cell.json's ``image_digest`` for ``cell`` (a mapping: a refused cell may be no valid one), when
    the launcher said what the node's copy is."""
    digests = node_digests(environ)
    pinned = cell.get("image_digest")
    found = ran_digest(pinned if isinstance(pinned, str) else "", digests or ())
    return {"image_digest": found} if found else {}
