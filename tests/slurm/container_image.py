"""A real container runtime for the launcher tests: podman, driven through the `docker` command line.

The image is built here, from nothing fetched: the files of a few installed Debian packages (C library,
bash, coreutils and the shared libraries Python needs, as `dpkg -L` lists them) plus the Python
interpreter the repository's virtualenv was made from, imported with `podman import`. With the
checkout mounted at its own path (as the launchers mount it), the virtualenv's interpreter runs in
it, so the simulated engine can run inside the container as a real engine runs inside its image.

`docker` is a two-line script that runs podman (what Debian's podman-docker package installs). Where
this machine's podman needs settings to start a container at all, they go in a containers.conf the
script points podman at: a hard open-files limit podman may not raise (its default is above what an
unprivileged container manager may set), and runc where crun refuses a hybrid cgroup hierarchy. When
no setting starts a container, `podman_docker` says exactly why.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

# Debian packages whose files make the image (the C library, a shell and its tools, what Python's
# standard extension modules link against).
PACKAGES = (
    "base-files", "libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libssl3", "libffi8", "libbz2-1.0",
    "liblzma5", "libsqlite3-0", "libuuid1", "libtinfo6", "libncursesw6", "libreadline8", "bash",
    "coreutils", "libacl1", "libattr1", "libselinux1", "libpcre2-8-0", "libgmp10",
)  # fmt: skip
SKIPPED_DIRS = ("/usr/share/doc", "/usr/share/man", "/usr/share/info", "/usr/share/locale")
MERGED = ("/bin", "/sbin", "/lib", "/lib64")  # merged /usr: these are links to /usr/...

DOCKER_SHIM = """#!/bin/sh
# docker -> podman (as Debian's podman-docker package does){conf}
exec podman "$@"
"""


class Unavailable(Exception):
    """Why this machine cannot run the container tests (one line)."""


@dataclass(frozen=True)
class PodmanDocker:
    """A working `docker` command (podman underneath) and an image it can run."""

    bin_dir: Path  # holds `docker`; put it first in PATH
    image: str


def _run(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def _package_files(packages: tuple[str, ...]) -> list[str]:
    installed = [
        p for p in packages if _run(["dpkg-query", "-W", "-f=${Status}", p]).stdout.endswith(" installed")
    ]
    listed = _run(["dpkg", "-L", *installed]).stdout.splitlines()
    files: set[str] = set()
    for path in listed:
        if not path.startswith("/") or path in MERGED or path.startswith(SKIPPED_DIRS):
            continue
        for top in MERGED:
            if path.startswith(top + "/") and os.path.islink(top):
                path = "/usr" + path
        if os.path.islink(path) or os.path.isfile(path):
            files.add(path)
    return sorted(files)


def _interpreter_prefix(venv_python: Path) -> Path:
    out = _run([str(venv_python), "-c", "import sys; print(sys.base_prefix)"])
    if out.returncode != 0:
        raise Unavailable(f"{venv_python} does not run: {out.stderr.strip()[-200:]}")
    return Path(out.stdout.strip())


def build_rootfs(tar_path: Path, venv_python: Path) -> None:
    """The image's files as a tar: Debian packages' files, the interpreter, /etc/passwd and group."""
    prefix = _interpreter_prefix(venv_python)
    with tarfile.open(tar_path, "w") as tar:
        for top in MERGED:
            if os.path.islink(top):
                info = tarfile.TarInfo(top.lstrip("/"))
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(top).lstrip("/")
                tar.addfile(info)
        for path in _package_files(PACKAGES):
            tar.add(path, arcname=path.lstrip("/"), recursive=False)
        if prefix != Path("/usr"):  # an interpreter of its own (pyenv, a build): its tree, lean

            def lean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
                parts = info.name.split("/")
                if "site-packages" in parts[:-1] or "test" in parts or "__pycache__" in parts:
                    return None
                return info

            tar.add(str(prefix), arcname=str(prefix).lstrip("/"), filter=lean)
        else:  # Debian's own python3.X
            version = f"{sys.version_info.major}.{sys.version_info.minor}"
            names = (f"python{version}-minimal", f"libpython{version}-minimal", f"libpython{version}-stdlib")
            for path in _package_files(names):
                tar.add(path, arcname=path.lstrip("/"), recursive=False)
        for path in ("/etc/passwd", "/etc/group"):
            tar.add(path, arcname=path.lstrip("/"))


def _limits_conf(path: Path) -> None:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    lines = ["[containers]", f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]']
    if shutil.which("runc"):
        lines += ["[engine]", 'runtime = "runc"']
    path.write_text("\n".join(lines) + "\n")


def podman_docker(work: Path, venv_python: Path, tag: str) -> PodmanDocker:
    """Build the image and find the podman settings that run it; raise ``Unavailable`` saying why not."""
    for tool in ("podman", "dpkg"):
        if shutil.which(tool) is None:
            raise Unavailable(f"{tool} not found (apt-get install podman runc)")
    work.mkdir(parents=True, exist_ok=True)
    rootfs = work / "rootfs.tar"
    build_rootfs(rootfs, venv_python)
    imported = _run(["podman", "import", str(rootfs), tag])
    rootfs.unlink()
    if imported.returncode != 0:
        raise Unavailable(f"podman import failed: {imported.stderr.strip()[-300:]}")
    conf = work / "containers.conf"
    tried: list[str] = []
    for settings in ("podman's defaults", "containers.conf"):
        env = dict(os.environ)
        if settings == "containers.conf":
            _limits_conf(conf)
            env["CONTAINERS_CONF"] = str(conf)
        probe = _run(["podman", "run", "--rm", "--network", "host", tag, "/bin/true"], env=env, timeout=120)
        if probe.returncode == 0:
            bin_dir = work / "bin"
            bin_dir.mkdir(exist_ok=True)
            shim = bin_dir / "docker"
            line = f"\nexport CONTAINERS_CONF={conf}" if settings == "containers.conf" else ""
            shim.write_text(DOCKER_SHIM.format(conf=line))
            shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            return PodmanDocker(bin_dir, tag)
        why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        tried.append(f"with {settings}: {why}")
    remove_image(tag)
    raise Unavailable("podman cannot start a container here (" + "; ".join(tried) + ")")


def remove_image(tag: str) -> None:
    _run(["podman", "rmi", "--force", tag], timeout=120)


def containers(label: str, running_only: bool = False) -> list[str]:
    """Names of the podman containers carrying ``label`` (``key=value``)."""
    argv = ["podman", "ps", "--filter", f"label={label}", "--format", "{{.Names}}"]
    if not running_only:
        argv.insert(2, "-a")
    return [n for n in _run(argv, timeout=60).stdout.split() if n]


def container_ids(image: str, label: str) -> set[str]:
    """Full ids of the podman containers of ``image`` carrying ``label`` (``key`` or ``key=value``),
    in any state. The image is one test session's own, so containers of other sessions on the same
    host (whose job ids, and so names and labels, may be the same) are left out."""
    argv = ["podman", "ps", "-a", "--no-trunc", "--filter", f"ancestor={image}", "--filter", f"label={label}"]
    return {i for i in _run([*argv, "--format", "{{.ID}}"], timeout=60).stdout.split() if i}


def processes_of(ids: set[str]) -> list[str]:
    """``PID command`` of every process still running for containers ``ids``: its conmon (the id is on
    its command line) and whatever runs inside it (the id is in its cgroup's path). podman can lose a
    container's record while these live on, so `podman ps` alone does not show that nothing is left."""
    if not ids:
        return []
    found: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            cgroup = (proc / "cgroup").read_text(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state == "Z":  # exited, waiting for its parent: nothing runs
            continue
        if any(i in cmdline or i in cgroup for i in ids):
            found.append(f"{proc.name} {cmdline[:200]}")
    return found


def kill_processes_of(ids: set[str]) -> None:
    """SIGKILL what ``processes_of`` finds (a test's own containers, so that a failing test leaves
    nothing running behind it)."""
    for line in processes_of(ids):
        with contextlib.suppress(OSError):
            os.kill(int(line.split()[0]), signal.SIGKILL)
