"""Reading a result file whole without blocking or reading without bound, and writing one atomically.

Every problem is a ``ResultFileError`` whose message starts with the file's name, so a collect row or
a cell's reason says which file broke and how.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

from kv_cache_tester.inputfiles import InputFileProblem, read_limited
from kv_cache_tester.metrics import finite
from pydantic import BaseModel, ValidationError

from agentsweep.contract.errors import validation_message
from agentsweep.contract.resultdir.files import result_file
from agentsweep.errors import ResultFileError

Model = TypeVar("Model", bound=BaseModel)


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename: a reader sees all or nothing.

    A write that fails (a full disk) leaves no temporary file and raises the OSError.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename is None:  # a write() that failed names no file: name the one being written
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


def exists(path: Path) -> bool:
    """True when something is at ``path`` (a broken link too: reading it then says so)."""
    return path.exists() or path.is_symlink()


def read_bytes(result_dir: Path, name: str) -> bytes | None:
    """The whole of a declared file, None when absent; at most its declared size, regular files only
    (a link is refused, never read through)."""
    path = result_dir / name
    if not exists(path):
        return None
    limit = result_file(name).max_bytes
    assert limit is not None, f"{name} is streamed, not read whole"
    try:
        return read_limited(path, limit, follow_links=False)
    except InputFileProblem as err:
        raise ResultFileError(f"{name}: {err}") from None


def read_json_object(result_dir: Path, name: str) -> tuple[bytes, dict[str, Any]] | None:
    """(raw bytes, decoded object) of a declared JSON file, None when absent."""
    raw = read_bytes(result_dir, name)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ResultFileError(f"{name}: unreadable ({err})") from None
    except (ValueError, RecursionError) as err:
        raise ResultFileError(f"{name}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ResultFileError(f"{name}: expected an object, got {type(data).__name__}")
    return raw, data


def parse_model(model: type[Model], raw: bytes, name: str) -> Model:
    """``raw`` (a JSON object) as ``model``, or ResultFileError ``<name>: <field>: <what>``."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        field, what = validation_message(err, model)
        raise ResultFileError(f"{name}: {field}: {what}" if field else f"{name}: {what}") from None


def read_model(result_dir: Path, name: str, model: type[Model]) -> Model | None:
    """A declared JSON file as ``model``, None when absent."""
    found = read_json_object(result_dir, name)
    return None if found is None else parse_model(model, found[0], name)


def finite_number(text: str) -> float | None:
    """A CSV cell of a result file as a finite number; None for text, inf or nan (the readers of
    server_metrics*.csv and power.csv count such cells, never take them as values)."""
    try:
        return finite(float(text))
    except ValueError:
        return None
