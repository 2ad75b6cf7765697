"""Resolve image tags to manifest digests through the Docker Registry HTTP API v2 (aiohttp).

``HEAD /v2/<repository>/manifests/<tag>`` with an ``Accept`` header that lists the OCI image index and
Docker manifest list first: a multi-arch image answers with its index, whose digest is what docker,
podman and enroot pull by, so the index digest is the one kept. The digest is the registry's
``Docker-Content-Digest`` header (or, when a registry leaves it out, the sha256 of the manifest body
a GET returns).

Authentication is the token flow Docker Hub and nvcr.io use: the registry answers 401 with
``WWW-Authenticate: Bearer realm="...",service="...",scope="..."``, the realm is asked for an anonymous
token for that service and scope, and the request is made again with ``Authorization: Bearer``.

Everything a registry or token service sends is untrusted: a digest must have the sha256 form, a token
reply is read up to TOKEN_MAX_BYTES, and every failure is one line (``RegistryAnswer``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlencode

import aiohttp

from agentsweep.images.reference import DOCKER_HUB, DOCKER_HUB_ALIASES, ImageRef, is_digest

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
TIMEOUT_S = 15.0
TOKEN_MAX_BYTES = 1 << 20
MANIFEST_MAX_BYTES = 4 << 20
CONCURRENCY = 4
_CHALLENGE_FIELD = re.compile(r'(\w+)="([^"]*)"')


class RegistryAnswer(Exception):
    """The registry's answer when it is not a manifest digest: missing, refused, or unreachable."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind  # missing | denied | unreachable


def mirror_map(pairs: Iterable[str]) -> dict[str, str]:
    """``FROM=TO`` pairs (``docker.io=127.0.0.1:5000``): ask TO for images of registry FROM."""
    out: dict[str, str] = {}
    for pair in pairs:
        source, sep, target = pair.partition("=")
        if not sep or not source.strip() or not target.strip() or "/" in target:
            raise ValueError(f"--mirror {pair!r}: expected REGISTRY=HOST[:PORT] (docker.io=127.0.0.1:5000)")
        source = DOCKER_HUB if source.strip() in DOCKER_HUB_ALIASES else source.strip()
        out[source] = target.strip()
    return out


def _challenge(header: str) -> dict[str, str]:
    """The fields of a ``Bearer`` challenge; RegistryAnswer for any other scheme."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise RegistryAnswer(
            "denied", f"the registry asks for {scheme or 'unnamed'} authentication, not a bearer token"
        )
    fields = dict(_CHALLENGE_FIELD.findall(rest))
    if not fields.get("realm", "").startswith(("https://", "http://")):
        raise RegistryAnswer(
            "denied", f"the registry's bearer challenge names no token service ({header[:120]})"
        )
    return fields


async def _token(session: aiohttp.ClientSession, header: str, repository: str) -> str:
    """An anonymous token for the service and scope the challenge names (pull of ``repository`` when
    it names no scope)."""
    fields = _challenge(header)
    query = {k: fields[k] for k in ("service", "scope") if k in fields}
    query.setdefault("scope", f"repository:{repository}:pull")
    realm = fields["realm"]
    url = f"{realm}{'&' if '?' in realm else '?'}{urlencode(query)}"
    try:
        async with session.get(url) as resp:
            body = await resp.content.read(TOKEN_MAX_BYTES + 1)
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as err:
        raise RegistryAnswer(
            "unreachable", f"token request to {realm} failed: {err or type(err).__name__}"
        ) from None
    if status != 200:
        raise RegistryAnswer("denied", f"the token service {realm} answered HTTP {status}")
    try:
        data = json.loads(body[:TOKEN_MAX_BYTES])
    except ValueError:
        data = None
    token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
    if not isinstance(token, str) or not token or any(c in token for c in "\r\n"):
        raise RegistryAnswer("denied", f"the token service {realm} gave no token")
    return token


async def _ask(
    session: aiohttp.ClientSession, method: str, url: str, headers: Mapping[str, str]
) -> tuple[int, Mapping[str, str], bytes]:
    async with session.request(method, url, headers=dict(headers)) as resp:
        body = await resp.content.read(MANIFEST_MAX_BYTES) if method == "GET" else b""
        return resp.status, resp.headers, body


async def resolve(
    session: aiohttp.ClientSession, image: str, mirrors: Mapping[str, str] | None = None
) -> str:
    """The manifest digest (an index's for a multi-arch image) the registry gives ``image``'s tag now.

    ``mirrors`` maps a registry (``registry-1.docker.io``) to the host asked in its place.
    """
    ref = ImageRef.parse(image)
    asked = ref.at(mirrors[ref.registry]) if mirrors and ref.registry in mirrors else ref
    url = f"{asked.base_url}/v2/{asked.repository}/manifests/{asked.reference}"
    headers = {"Accept": MANIFEST_TYPES}
    try:
        status, got, _ = await _ask(session, "HEAD", url, headers)
        if status == 401:
            token = await _token(session, got.get("WWW-Authenticate", ""), asked.repository)
            headers["Authorization"] = f"Bearer {token}"
            status, got, _ = await _ask(session, "HEAD", url, headers)
        digest = got.get("Docker-Content-Digest", "")
        if status == 200 and not digest:  # the header is optional for a registry: hash the manifest
            status, got, body = await _ask(session, "GET", url, headers)
            digest = "sha256:" + hashlib.sha256(body).hexdigest() if status == 200 else ""
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        why = str(err) or type(err).__name__
        raise RegistryAnswer("unreachable", f"cannot reach {asked.registry} ({why})") from None
    where = f"{asked.registry}/{asked.repository}:{asked.reference}"
    if status == 200:
        if not is_digest(digest):
            raise RegistryAnswer("denied", f"{where}: the registry gave no sha256 digest ({digest[:80]!r})")
        return digest
    if status == 404:
        raise RegistryAnswer("missing", f"{asked.registry} has no {asked.repository}:{asked.reference}")
    if status in (401, 403):
        raise RegistryAnswer(
            "denied", f"{asked.registry} refuses {asked.repository} (HTTP {status}: private, or a typo)"
        )
    raise RegistryAnswer("unreachable", f"{asked.registry} answered HTTP {status} for {where}")


async def resolve_all(
    images: Iterable[str], mirrors: Mapping[str, str] | None = None
) -> dict[str, str | RegistryAnswer]:
    """Each image's digest, or the answer that stood in for it; at most CONCURRENCY requests at once."""
    wanted = list(dict.fromkeys(images))
    gate = asyncio.Semaphore(CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)

    async with aiohttp.ClientSession(timeout=timeout, trust_env=True) as session:

        async def one(image: str) -> str | RegistryAnswer:
            async with gate:
                try:
                    return await resolve(session, image, mirrors)
                except RegistryAnswer as answer:
                    return answer

        found = await asyncio.gather(*(one(image) for image in wanted))
    return dict(zip(wanted, found, strict=True))


def manifest_digest(image: str, mirrors: Mapping[str, str] | None = None) -> str:
    """``resolve`` from synchronous code (preflight); RegistryAnswer when the registry gives no digest."""
    answer = asyncio.run(resolve_all([image], mirrors))[image]
    if isinstance(answer, RegistryAnswer):
        raise answer
    return answer
