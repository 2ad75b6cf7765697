"""Collect's files written whole or not at all: through a temporary sibling and a rename.

A folder of outputs that someone may be reading (the sweep's aggregated/) is replaced whole:
written beside it, then exchanged with it in one step (``replace_folder``), so a reader never finds
it missing or half written.

A write that fails (a full disk, a read-only folder) removes its temporary file and is one line naming
the file (``WriteError``, exit status 2). A command's outputs are one set (``one_set``): when one of
them cannot be written, the set's files already in the folder go too, so a folder never holds a
partial set (a fresh summary.csv beside no frontier, or an older report) that reads as complete.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from agentsweep.errors import WriteError


@contextlib.contextmanager
def one_set(out_dir: Path, names: Iterable[str]) -> Iterator[None]:
    """Write a set of outputs into ``out_dir``; on a WriteError every file of the set there is removed
    (``names`` may hold glob patterns) and the error says so."""
    try:
        yield
    except WriteError as err:
        for pattern in names:
            for path in out_dir.glob(pattern):
                with contextlib.suppress(OSError):
                    if path.is_file():
                        path.unlink()
        raise WriteError.after(err, f"none of its outputs are left in {out_dir}") from None


@contextlib.contextmanager
def writing(path: Path) -> Iterator[Path]:
    """The temporary path to write ``path``'s content to; renamed onto ``path`` on success."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise WriteError(path, err) from None


def write_text(path: Path, text: str) -> Path:
    with writing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def write_csv(frame: Any, path: Path) -> Path:
    """A DataFrame as CSV without its index."""
    with writing(path) as tmp:
        frame.to_csv(tmp, index=False)
    return path


# zlib level 3 instead of Pillow's 6: a third less time encoding a sweep's figures, 5% larger files.
PNG_COMPRESS_LEVEL = 3


def save_figure(fig: Any, path: Path) -> Path:
    """A matplotlib figure in the format its name says (PNG)."""
    fmt = path.suffix.lstrip(".") or "png"
    extra = {"pil_kwargs": {"compress_level": PNG_COMPRESS_LEVEL}} if fmt == "png" else {}
    with writing(path) as tmp:
        fig.savefig(tmp, format=fmt, **extra)
    return path


AT_FDCWD = -100
RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system has no
    such call (another kernel or libc, a file system without it)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    done = renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    return bool(done == 0)


def replace_folder(new: Path, target: Path) -> None:
    """Put folder ``new`` where ``target`` is and remove the old one. The two are exchanged in one
    step where the system can (a reader of ``target`` sees the old folder or the new, never none);
    elsewhere the old folder is moved aside first, leaving ``target`` missing for an instant. A reader
    holding an old file open keeps reading it."""
    if not target.exists():
        os.replace(new, target)
        return
    if _exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # now the old folder
        return
    aside = target.with_name(f".{target.name}.old")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(target, aside)
    os.replace(new, target)
    shutil.rmtree(aside, ignore_errors=True)
