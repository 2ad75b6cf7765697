"""A full disk under a cell: the cell still leaves a readable verdict and no temporary file.

The cell writes ``.verdict.reserve`` (RESERVE_BYTES of zeros) into its result directory before
anything else, and removes it before it ends. When the disk fills during the run (the replayer's
records, the logs, the scrapes), writing the verdict fails; the cell then removes the reserve and
every temporary file, which frees room for cell.json and status.txt, and writes FAILED with the reason
``no space left on ...``. A run that failed while its file system is nearly full (under
LOW_SPACE_BYTES free: the replayer or a scraper died of it in its own process) gets that reason too,
with what the run said after it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

RESERVE_NAME = ".verdict.reserve"
RESERVE_BYTES = 256 << 10
LOW_SPACE_BYTES = 1 << 20


def is_no_space(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def reserve(result_dir: Path) -> None:
    """Hold RESERVE_BYTES of the result directory's file system for the verdict."""
    path = result_dir / RESERVE_NAME
    try:
        with open(path, "wb") as fh:
            fh.write(bytes(RESERVE_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        path.unlink(missing_ok=True)
        raise


def release(result_dir: Path) -> None:
    """Give back the reserve and remove every temporary file a writer left (a ``*.tmp`` at the top)."""
    (result_dir / RESERVE_NAME).unlink(missing_ok=True)
    try:
        entries = list(result_dir.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.endswith(".tmp") and entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s file system, or None."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def _shown(free: int | None) -> str:
    if free is None:
        return "free space unknown"
    return f"{free} bytes free" if free < 1024 else f"{free >> 10} KiB free"


def short_of_space(result_dir: Path) -> bool:
    free = free_bytes(result_dir)
    return free is not None and free < LOW_SPACE_BYTES


def no_space_reason(result_dir: Path, err: OSError | None = None, after: str | None = None) -> str:
    """``no space left on the file system of <dir> (<free>): ...``, naming the file a write failed on."""
    where = f"no space left on the file system of {result_dir} ({_shown(free_bytes(result_dir))})"
    if err is not None:
        name = err.filename if isinstance(err.filename, str) else None
        where += f": cannot write {name}" if name else f": {err.strerror or err}"
    return f"{where}; {after}" if after else where
