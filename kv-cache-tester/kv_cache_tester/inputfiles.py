"""Reading input files safely: regular files only, with a size limit, and the encoding named.

Opening a FIFO for reading blocks until a writer appears, and a character device such as /dev/zero
never ends, so every input is checked with ``os.stat`` before it is opened (and again with ``fstat``
on a non-blocking descriptor, in case it was swapped in between). A reader of untrusted results
passes ``follow_links=False``: a symbolic link is then refused rather than read through (a link in a
result directory could point anywhere on the machine that reads it). Problems are raised as
:class:`InputFileProblem` whose message says what is wrong without the path; the caller prefixes the
name it shows (a file, a config key) and raises its own error type.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

__all__ = [
    "InputFileProblem",
    "check_regular",
    "describe_encoding",
    "open_regular",
    "read_limited",
    "size_text",
]


class InputFileProblem(ValueError):
    """What is wrong with an input file, as a phrase (no path): 'not a regular file (a FIFO)'."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def size_text(n: int) -> str:
    """A byte count as people write limits: 1 MiB, 1.5 GiB, 300 bytes."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a file"


def check_regular(path: str | os.PathLike[str], *, follow_links: bool = True) -> os.stat_result:
    """``os.stat`` of a regular file; anything else raises InputFileProblem. Links are followed
    unless ``follow_links`` is False, when a link is refused whatever it points to."""
    try:
        st = os.stat(path) if follow_links else os.lstat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputFileProblem(f"broken symbolic link (to {os.readlink(path)!r})") from None
        raise InputFileProblem("file not found") from None
    except OSError as err:
        raise InputFileProblem(f"cannot read: {err.strerror or err}") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputFileProblem(f"a symbolic link (to {os.readlink(path)!r}); only regular files are read")
    if not stat.S_ISREG(st.st_mode):
        raise InputFileProblem(f"not a regular file ({_kind(st.st_mode)})")
    return st


def open_regular(
    path: str | os.PathLike[str], limit: int | None = None, *, follow_links: bool = True
) -> BinaryIO:
    """Open a regular file for binary reading without ever blocking on a FIFO.

    With ``limit``, a file larger than ``limit`` bytes is refused before anything is read. With
    ``follow_links=False`` a symbolic link is refused (also one swapped in after the check).
    """
    check_regular(path, follow_links=follow_links)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a link swapped in after the check
            raise InputFileProblem("a symbolic link; only regular files are read") from None
        raise InputFileProblem(f"cannot read: {err.strerror or err}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between stat and open
            raise InputFileProblem(f"not a regular file ({_kind(st.st_mode)})")
        if limit is not None and st.st_size > limit:
            raise InputFileProblem(f"{size_text(st.st_size)} is over the {size_text(limit)} limit")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: str | os.PathLike[str], limit: int, *, follow_links: bool = True) -> bytes:
    """All bytes of a regular file of at most ``limit`` bytes (checked again while reading)."""
    with open_regular(path, limit, follow_links=follow_links) as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as err:
            raise InputFileProblem(f"cannot read: {err.strerror or err}") from None
    if len(data) > limit:  # grew after the size check
        raise InputFileProblem(f"more than the {size_text(limit)} limit")
    return data


_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32-LE (with a byte order mark)"),
    (b"\x00\x00\xfe\xff", "UTF-32-BE (with a byte order mark)"),
    (b"\xff\xfe", "UTF-16-LE (with a byte order mark)"),
    (b"\xfe\xff", "UTF-16-BE (with a byte order mark)"),
)


def describe_encoding(head: bytes) -> str | None:
    """The name of a non-UTF-8 Unicode encoding that ``head`` (a file's first bytes) is in, or None.

    Recognized: UTF-16 and UTF-32 with a byte order mark, and without one when the text starts
    with an ASCII character (zero bytes next to it give the layout away).
    """
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    if len(head) >= 4:
        if head[0] and not head[1] and not head[2] and not head[3]:
            return "UTF-32-LE"
        if not head[0] and not head[1] and not head[2] and head[3]:
            return "UTF-32-BE"
    if len(head) >= 2:
        if head[0] and not head[1]:
            return "UTF-16-LE"
        if not head[0] and head[1]:
            return "UTF-16-BE"
    return None
