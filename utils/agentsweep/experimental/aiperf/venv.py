"""Find (or create on first use) AIPerf's own virtualenv: it is large and pins its own dependencies."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from agentsweep.errors import RunError

AIPERF_VERSION = "0.13.0"
BIN_VAR = "AGENTSWEEP_AIPERF_BIN"  # an aiperf executable to use as it is
VENV_VAR = "AGENTSWEEP_AIPERF_VENV"  # where the virtualenv lives / is created


def default_venv() -> Path:
    if os.environ.get(VENV_VAR):
        return Path(os.environ[VENV_VAR])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "agentsweep" / f"aiperf-{AIPERF_VERSION}"


def setup_script() -> Path | None:
    """experimental/aiperf/setup_venv.sh of a source checkout (None in an installed package)."""
    script = Path(__file__).resolve().parents[4] / "experimental" / "aiperf" / "setup_venv.sh"
    return script if script.is_file() else None


def find_aiperf() -> Path | None:
    """The aiperf executable to use, without installing anything."""
    explicit = os.environ.get(BIN_VAR)
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    exe = default_venv() / "bin" / "aiperf"
    return exe if exe.is_file() else None


def ensure_aiperf(*, install: bool = True, log: Callable[[str], None] = print) -> Path:
    """The aiperf executable; creates the virtualenv on first use (``pip install aiperf``)."""
    found = find_aiperf()
    if found is not None:
        return found
    if os.environ.get(BIN_VAR):
        raise RunError(f"{BIN_VAR}={os.environ[BIN_VAR]}: no such executable")
    venv = default_venv()
    if not install:
        raise RunError(f"aiperf is not installed in {venv} (run experimental/aiperf/setup_venv.sh)")
    log(f"installing aiperf {AIPERF_VERSION} into {venv} (about 1.2 GB, a minute or more)")
    script = setup_script()
    env = {**os.environ, "AIPERF_VERSION": AIPERF_VERSION}
    if script is not None:
        argv = ["bash", str(script), str(venv)]
    else:  # installed package without the helper script: same steps inline
        python = shutil.which("python3") or "python3"
        argv = [
            "bash",
            "-c",
            f'set -e; "{python}" -m venv "$1"; "$1/bin/python" -m pip install --quiet '
            f'"aiperf=={AIPERF_VERSION}"',
            "install",
            str(venv),
        ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    exe = venv / "bin" / "aiperf"
    if proc.returncode != 0 or not exe.is_file():
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "Location" not in ln]
        tail = lines[-1:] or ["no output"]
        raise RunError(f"could not install aiperf {AIPERF_VERSION} into {venv}: {tail[0]}")
    return exe
