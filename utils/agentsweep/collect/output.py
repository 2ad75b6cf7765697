"""Collect's files written whole or not at all: through a temporary sibling and a rename.

A write that fails (a full disk, a read-only folder) removes its temporary file and is one line naming
the file (``WriteError``, exit status 2). A command's outputs are one set (``one_set``): when one of
them cannot be written, the set's files already in the folder go too, so a folder never holds a
partial set (a fresh summary.csv beside no frontier, or an older report) that reads as complete.
"""

from __future__ import annotations

import contextlib
import os
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


def save_figure(fig: Any, path: Path) -> Path:
    """A matplotlib figure in the format its name says (PNG)."""
    with writing(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png")
    return path
