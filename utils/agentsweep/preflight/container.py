"""Container checks: the runtime the launcher uses answers, and the image is present or pullable.

The image is looked for where the launcher would take it from: the enroot squash file it imports once
(pyxis) or the local docker image store (docker); otherwise its registry is asked for the manifest
over the registry HTTP API (``GET /v2/<repo>/manifests/<tag>``, anonymous bearer token when the
registry asks for one), which also gives the digest to pin in the config
(``image: repo:tag@sha256:...``). A registry on ``localhost``/``127.*`` is spoken to over plain HTTP,
as docker does.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from agentsweep.preflight.node import Run, _last
from agentsweep.preflight.report import Check, failed, passed, skipped

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
DOCKER_HUB = "registry-1.docker.io"
TIMEOUT_S = 15.0


@dataclass(frozen=True)
class ImageRef:
    """``[registry/]repository[:tag][@digest]`` split the way docker reads it."""

    registry: str
    repository: str
    reference: str  # the digest when given, else the tag

    @classmethod
    def parse(cls, image: str) -> ImageRef:
        name, _, digest = image.partition("@")
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
        else:
            registry, path = DOCKER_HUB, name
        repo, _, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "latest")
        if registry == DOCKER_HUB and "/" not in repo:
            repo = f"library/{repo}"
        return cls(registry, repo, digest or tag)

    @property
    def base_url(self) -> str:
        host = self.registry.split(":", 1)[0]
        scheme = "http" if host == "localhost" or host.startswith("127.") else "https"
        return f"{scheme}://{self.registry}"


def squash_path(image: str, environ: dict[str, str]) -> Path:
    """Where the launcher keeps the image's enroot squash file (runners/lib/container.sh as_squash_path)."""
    root = environ.get("AGENTSWEEP_SQUASH_DIR") or f"{environ.get('HOME') or '/tmp'}/.cache/agentsweep/squash"
    return Path(root) / (re.sub(r"[^A-Za-z0-9._-]", "_", image) + ".sqsh")


class RegistryAnswer(Exception):
    """The registry's answer when it is not a manifest: missing, refused, or unreachable."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind  # missing | denied | unreachable


def _open(request: urllib.request.Request) -> tuple[int, dict[str, str]]:
    opener = urllib.request.build_opener()
    try:
        with opener.open(request, timeout=TIMEOUT_S) as resp:
            return resp.status, dict(resp.headers.items())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers.items())


def _token(challenge: str, ref: ImageRef) -> str:
    """An anonymous bearer token for the scope a ``WWW-Authenticate: Bearer ...`` challenge names."""
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in fields:
        raise RegistryAnswer("denied", f"registry asks for authentication ({challenge[:120]})")
    query = {k: v for k, v in fields.items() if k in ("service", "scope")}
    query.setdefault("scope", f"repository:{ref.repository}:pull")
    url = f"{fields['realm']}?{urllib.parse.urlencode(query)}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError) as err:
        raise RegistryAnswer("unreachable", f"token request to {fields['realm']} failed: {err}") from None
    token = data.get("token") or data.get("access_token")
    if not token:
        raise RegistryAnswer("denied", "the registry's token service gave no token")
    return str(token)


def manifest_digest(image: str) -> str:
    """The digest the registry gives for ``image``'s manifest; RegistryAnswer when it gives none."""
    ref = ImageRef.parse(image)
    url = f"{ref.base_url}/v2/{ref.repository}/manifests/{ref.reference}"
    headers = {"Accept": MANIFEST_TYPES}
    try:
        status, got = _open(urllib.request.Request(url, headers=headers, method="HEAD"))
        if status == 401:
            headers["Authorization"] = (
                f"Bearer {_token(got.get('Www-Authenticate', got.get('WWW-Authenticate', '')), ref)}"
            )
            status, got = _open(urllib.request.Request(url, headers=headers, method="HEAD"))
    except OSError as err:
        raise RegistryAnswer(
            "unreachable", f"cannot reach {ref.registry} ({getattr(err, 'reason', err)})"
        ) from None
    if status == 200:
        digest = got.get("Docker-Content-Digest") or got.get("docker-content-digest")
        if digest:
            return digest
        if ref.reference.startswith("sha256:"):
            return ref.reference
        raise RegistryAnswer("denied", f"{ref.registry} answered without a Docker-Content-Digest")
    if status == 404:
        raise RegistryAnswer("missing", f"{ref.registry} has no {ref.repository}:{ref.reference}")
    if status in (401, 403):
        raise RegistryAnswer(
            "denied", f"{ref.registry} refuses {ref.repository} (HTTP {status}: private, or a typo)"
        )
    raise RegistryAnswer("unreachable", f"{ref.registry} answered HTTP {status}")


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


def image_check(image: str, runtime: str, environ: dict[str, str], run: Run) -> Check:
    """The image is already where the launcher takes it from, or its registry has it (with its digest)."""
    name = "container.image"
    if runtime == "none":
        return skipped(name, "no container: the engine runs from the host's installation")
    if not image:
        return failed(name, "the entry has no image", "set image: in the config entry (repo:tag)")
    local = ""
    if runtime == "pyxis":
        sqsh = squash_path(image, environ)
        if sqsh.is_file() and sqsh.stat().st_size > 0:
            local = f"imported as {sqsh}"
    elif run(["docker", "image", "inspect", image])[0] == 0:
        local = "in the local docker image store"
    try:
        digest = manifest_digest(image)
    except RegistryAnswer as answer:
        if local:
            return passed(name, f"{image} {local} (registry not asked: {answer})")
        fixes = {
            "missing": "correct image: in the config entry (check the tag exists), or push the image",
            "denied": "correct image: in the config entry, or log in to the registry where cells pull",
            "unreachable": "import the image once where the nodes can read it (enroot import / docker pull), or open the registry to this host",
        }
        return failed(name, f"{image}: not present here and {answer}", fixes[answer.kind])
    pinned = "@" in image
    where = f"{local}; " if local else ""
    hint = "" if pinned else f" (pin it: image: {image}@{digest})"
    return passed(name, f"{image}: {where}registry digest {digest}{hint}")


def host_environ() -> dict[str, str]:
    return dict(os.environ)
