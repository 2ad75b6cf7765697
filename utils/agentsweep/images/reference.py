"""An image reference (``[registry/]repository[:tag][@digest]``) split the way docker reads it."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

DOCKER_HUB = "registry-1.docker.io"
# Names that mean Docker Hub in a reference or a mirror mapping.
DOCKER_HUB_ALIASES = frozenset({DOCKER_HUB, "docker.io", "index.docker.io"})
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


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
        if registry in DOCKER_HUB_ALIASES:
            registry = DOCKER_HUB
        repo, _, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "latest")
        if registry == DOCKER_HUB and "/" not in repo:
            repo = f"library/{repo}"
        return cls(registry, repo, digest or tag)

    @property
    def base_url(self) -> str:
        """The registry's URL: plain HTTP on loopback (as docker speaks to a local registry), else HTTPS."""
        host = self.registry.rsplit(":", 1)[0] if not self.registry.startswith("[") else self.registry
        loopback = host in ("localhost", "[::1]") or host.startswith("127.")
        return f"{'http' if loopback else 'https'}://{self.registry}"

    def at(self, registry: str) -> ImageRef:
        """The same repository and reference on another registry (a mirror)."""
        return replace(self, registry=registry)

    def __str__(self) -> str:
        sep = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.registry}/{self.repository}{sep}{self.reference}"


def inline_digest(image: str) -> str:
    """The digest written into ``image`` (``repo:tag@sha256:...``), or ""."""
    return image.partition("@")[2]


def is_digest(text: str) -> bool:
    return bool(DIGEST.match(text))
