"""A real container registry on loopback (Debian's docker-registry, the distribution registry) and
images pushed to it through the registry HTTP API: one-layer images and multi-arch indexes."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .ports import free_port

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


class NoRegistry(Exception):
    """Why no registry runs here (one line)."""


@contextlib.contextmanager
def running_registry(root: Path) -> Iterator[str]:
    """docker-registry serving ``root`` on 127.0.0.1; yields its host:port."""
    exe = shutil.which("docker-registry")
    if exe is None:
        raise NoRegistry("docker-registry not installed (apt-get install docker-registry)")
    port = free_port()
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nlog: {{level: error}}\nstorage: {{filesystem: {{rootdirectory: {root / 'data'}}}, "
        f"delete: {{enabled: true}}}}\nhttp: {{addr: 127.0.0.1:{port}}}\n"
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
                    raise NoRegistry(f"docker-registry did not start: {err[-300:]}") from None
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


def put_manifest(host: str, repo: str, reference: str, body: bytes, media_type: str) -> str:
    """PUT a manifest (or index) under a tag; returns its digest (sha256 of the bytes sent)."""
    put = urllib.request.Request(
        f"http://{host}/v2/{repo}/manifests/{reference}",
        method="PUT",
        data=body,
        headers={"Content-Type": media_type},
    )
    urllib.request.urlopen(put).close()
    return "sha256:" + hashlib.sha256(body).hexdigest()


def image_manifest(host: str, repo: str, content: bytes = b"hello\n", arch: str = "amd64") -> bytes:
    """Upload a one-file image's layer and config; returns its (not yet tagged) manifest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    layer = gzip.compress(buf.getvalue(), mtime=0)
    config = json.dumps(
        {
            "architecture": arch,
            "os": "linux",
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(buf.getvalue()).hexdigest()],
            },
        }
    ).encode()
    return json.dumps(
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


def push_tiny_image(host: str, repo: str, tag: str, content: bytes = b"hello\n") -> str:
    """Push a one-file image (its file holding ``content``) under ``tag``; returns its manifest digest."""
    return put_manifest(host, repo, tag, image_manifest(host, repo, content), MANIFEST_V2)


def push_multi_arch(host: str, repo: str, tag: str, content: bytes = b"hello\n") -> tuple[str, list[str]]:
    """Push an amd64 and an arm64 image and an OCI index of both under ``tag``; returns (the index's
    digest, the platform manifests' digests)."""
    entries, digests = [], []
    for arch in ("amd64", "arm64"):
        body = image_manifest(host, repo, content + arch.encode(), arch)
        digest = put_manifest(host, repo, "sha256:" + hashlib.sha256(body).hexdigest(), body, MANIFEST_V2)
        digests.append(digest)
        entries.append(
            {
                "mediaType": MANIFEST_V2,
                "size": len(body),
                "digest": digest,
                "platform": {"architecture": arch, "os": "linux"},
            }
        )
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    return put_manifest(host, repo, tag, index, OCI_INDEX), digests
