"""A file a command writes where the user said (``export -o FILE``): a regular file, or nothing.

The file is written to a temporary sibling and renamed onto the target, so a reader sees all of it or
the old one. A rename replaces whatever holds the name, so the target is checked first: it must be
absent or a regular file. A FIFO, a device node (as root, ``-o /dev/null`` would become a regular
file), a socket, a folder or a symbolic link there is refused with one line (exit 2). The temporary
file is created with a fresh name (``O_EXCL``), never opened where something may already wait.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from kv_cache_tester.inputfiles import InputFileProblem, check_regular

from agentsweep.errors import InputError, WriteError

TMP_PREFIX = ".agentsweep-output-"


def check_target(path: Path, flag: str) -> None:
    """Refuse ``path`` as an output file unless it is absent or a regular file (InputError)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as err:  # a name too long, a parent that is a file
        raise InputError(f"{flag} {path}: cannot write there: {(err.strerror or str(err)).lower()}") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(f"{flag} {path}: is a symbolic link; name a regular file (or a new one)")
    try:
        check_regular(path)
    except InputFileProblem as err:
        raise InputError(f"{flag} {path}: exists and is {err}; name a regular file (or a new one)") from None


def write_text(path: Path, text: str, flag: str) -> None:
    """``text`` into ``path`` (checked by ``check_target``), whole or not at all; the folder is made
    when missing. A write that fails is a WriteError and leaves no temporary file."""
    check_target(path, flag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise WriteError(path, err) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise WriteError(path, err) from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
