"""A small tmpfs, filled up to a given free space: a real full disk (needs root to mount)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def filled_tmpfs(mount: Path, size_kib: int, leave_kib: int) -> Iterator[Path]:
    """Mount a ``size_kib`` tmpfs at ``mount`` and fill it until about ``leave_kib`` stay free; skips
    the test where mounting is not allowed. Unmounted on the way out."""
    mount.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        stats = os.statvfs(mount)
        fill = stats.f_bavail * stats.f_frsize - leave_kib * 1024
        if fill > 0:
            with open(mount / ".filler", "wb") as fh:
                fh.write(bytes(fill))
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
