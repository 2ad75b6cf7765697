"""Fetch a workflow run's artifacts with the GitHub CLI (`gh run download`), for ingest.

`gh run download RUN --dir DIR` leaves each artifact extracted in ``DIR/<artifact name>/`` (the cell
results as ``agentic_<exp_name>/``, beside ``agentic_aggregated/`` and ``sweep_matrix/``, which hold
no result directory); ingest also takes the artifacts' zip files as GitHub serves them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from agentsweep.errors import InputError

RUN_ID = re.compile(r"^[0-9]{1,20}$")
REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,38}/[A-Za-z0-9_.-]{1,100}$")
DOWNLOAD_TIMEOUT_S = 3600


def check_args(run_id: str, repo: str | None) -> None:
    if not RUN_ID.match(run_id):
        raise InputError(f"--gh-run {run_id!r}: a workflow run id is a number")
    if repo is not None and not REPO.match(repo):
        raise InputError(f"--repo {repo!r}: expected OWNER/NAME")


def download_command(run_id: str, repo: str | None, into: Path) -> list[str]:
    """The `gh` command line that downloads every artifact of the run into ``into``."""
    check_args(run_id, repo)
    cmd = ["gh", "run", "download", run_id, "--dir", str(into)]
    if repo:
        cmd += ["--repo", repo]
    return cmd


def run_key(run_id: str, repo: str | None) -> str:
    """The store's key for the run (a second download of the same run adds to the same run)."""
    return f"gh:{repo or ''}:{run_id}"


def download(run_id: str, repo: str | None, into: Path) -> None:
    """Run `gh run download`; InputError naming the run when gh is missing or refuses."""
    cmd = download_command(run_id, repo, into)
    if shutil.which(cmd[0]) is None:
        raise InputError("gh: the GitHub CLI is not installed (https://cli.github.com); needed by --gh-run")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(f"gh run download {run_id}: no answer in {DOWNLOAD_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout).split())[-300:]
        where = f" ({repo})" if repo else ""
        raise InputError(f"gh run download {run_id}{where}: failed with status {proc.returncode}: {tail}")
