"""Load traces from a directory, a file, or ``hf:<org>/<dataset>`` into the normalized model.

Accepted inputs (``.gz`` variants too):

* ``*.json``: one kv-cache-tester trace object (or a JSON list of them);
* ``*.jsonl``: one trace object per line (the Hugging Face weka layout), or mooncake_trace rows
  (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``; global ids), detected from
  the first row; each mooncake row becomes a one-request trace with its arrival time in ``Trace.t0``;
* a directory: every ``*.json`` / ``*.jsonl`` below it, in sorted path order;
* ``hf:<org>/<dataset>``: the dataset's JSON/JSONL files, downloaded into the Hugging Face cache and
  read locally (offline from the cache when the hub cannot be reached).

Files are parsed one at a time and only the normalized traces are kept.

Bounds: only regular files are read (a FIFO or device is refused before it is opened); a file may
hold at most MAX_TRACE_BYTES once decompressed; text must be UTF-8 (a UTF-8 byte order mark is
skipped; UTF-16/UTF-32 are named in the error). In a directory, a symbolic link is followed only
when it leads to a file inside that directory (for ``hf:`` sources, inside the dataset's cache
folder); other links are skipped and listed in the load report, and a broken one is an error.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from kv_cache_tester.errors import TraceError
from kv_cache_tester.inputfiles import InputFileProblem, describe_encoding, open_regular, size_text
from kv_cache_tester.traces.filters import FilterReport, MaxContextMode, apply_filters
from kv_cache_tester.traces.model import Trace
from kv_cache_tester.traces.validate import is_mooncake_row, parse_mooncake_row, parse_trace

TRACE_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
MOONCAKE_BLOCK_SIZE = 512
# One trace file, decompressed. The largest public agentic trace files are tens of MiB; a parsed
# file takes several times its size in memory, so a bigger one is better split.
MAX_TRACE_BYTES = 1 << 30
_UTF8_BOM = b"\xef\xbb\xbf"

try:  # optional speed-up (extra "fast")
    import orjson

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment

    def _loads(data: bytes | str) -> Any:  # as strict as orjson: NaN and Infinity are not JSON
        return json.loads(data, parse_constant=_no_constant)


@dataclass(slots=True)
class LoadResult:
    """Loaded traces plus what the filters removed (print ``report.lines()``)."""

    traces: list[Trace]
    report: FilterReport
    source: str
    dataset: str
    files: list[str] = field(default_factory=list)

    @property
    def num_requests(self) -> int:
        return sum(t.num_requests for t in self.traces)


def _open(path: Path, shown: str) -> BinaryIO | gzip.GzipFile:
    """A regular file opened for binary reading (decompressed for .gz); never blocks on a FIFO."""
    gz = path.name.endswith(".gz")
    try:
        fh = open_regular(path)
    except InputFileProblem as err:
        raise TraceError(f"{shown}: {err}") from None
    if not gz and os.fstat(fh.fileno()).st_size > MAX_TRACE_BYTES:  # refused before reading
        fh.close()
        raise _too_big(shown, compressed=False)
    return gzip.GzipFile(fileobj=fh, mode="rb") if gz else fh


def _too_big(shown: str, compressed: bool) -> TraceError:
    what = "decompressed, it is" if compressed else "it is"
    return TraceError(
        f"{shown}: {what} over the {size_text(MAX_TRACE_BYTES)} limit for one trace file; split it"
    )


def _check_encoding(head: bytes, shown: str) -> None:
    encoding = describe_encoding(head[:4])
    if encoding:
        raise TraceError(f"{shown}: the file is {encoding} text; traces must be UTF-8")


def _strip_gz(name: str) -> str:
    return name[:-3] if name.endswith(".gz") else name


def _json_problem(data: bytes, failure: str = "") -> tuple[str, int, int]:
    """(message, line, column) of the first JSON syntax error in ``data``, from the stdlib parser.

    ``failure`` is what the fast parser said, used when the stdlib parser finds nothing wrong.
    """
    try:
        json.loads(data, parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        return err.msg, err.lineno, err.colno
    except UnicodeDecodeError as err:
        return f"not UTF-8 text ({err.reason}, byte {data[err.start]:#04x})", 1, err.start + 1
    except _NonStandard as err:
        return f"{err} is not valid JSON (write a number or null)", 1, 1
    except RecursionError:
        return "nested too deeply for the JSON parser (a trace nests about 6 levels)", 1, 1
    if "depth limit" in failure:  # orjson stops at 1024 levels; the stdlib parser went deeper
        return "nested too deeply for the JSON parser (a trace nests about 6 levels)", 1, 1
    return f"unreadable ({failure})" if failure else "unreadable", 1, 1


class _NonStandard(ValueError):
    """NaN / Infinity: Python's json reads them, strict parsers (orjson) do not."""


def _no_constant(name: str) -> Any:
    raise _NonStandard(name)


# What reading a damaged file raises: OSError (gzip.BadGzipFile too), EOFError (a truncated .gz),
# zlib.error (corrupt compressed data).
_READ_ERRORS = (OSError, EOFError, zlib.error)


def _read_problem(err: BaseException) -> str:
    if isinstance(err, EOFError):
        return "truncated compressed file"
    text = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    return text or type(err).__name__


def _lines(fh: BinaryIO | gzip.GzipFile, shown: str, compressed: bool) -> Iterator[bytes]:
    """The lines of ``fh``, at most MAX_TRACE_BYTES in all; a read error part way (a truncated .gz)
    is a TraceError naming the line. The first line loses a UTF-8 byte order mark."""
    lineno = 0
    left = MAX_TRACE_BYTES
    try:
        while True:
            line = fh.readline(left + 1)
            if not line:
                return
            lineno += 1
            left -= len(line)
            if left < 0:
                raise _too_big(shown, compressed)
            if lineno == 1:
                _check_encoding(line, shown)
                line = line.removeprefix(_UTF8_BOM)
            yield line
    except _READ_ERRORS as err:
        raise TraceError(f"{shown}: line {lineno + 1}: cannot read: {_read_problem(err)}") from None


def _load_json(path: Path, shown: str) -> Any:
    compressed = path.name.endswith(".gz")
    try:
        with _open(path, shown) as fh:
            data = fh.read(MAX_TRACE_BYTES + 1)
    except _READ_ERRORS as err:
        raise TraceError(f"{shown}: cannot read: {_read_problem(err)}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise _too_big(shown, compressed)
    _check_encoding(data, shown)
    data = data.removeprefix(_UTF8_BOM)
    try:
        return _loads(data)
    except (ValueError, RecursionError) as err:
        msg, line, col = _json_problem(data, str(err))
        raise TraceError(f"{shown}: bad JSON at line {line} column {col}: {msg}") from None


def iter_file(
    path: Path, *, shown: str | None = None, dataset: str = "", mooncake_block_size: int = MOONCAKE_BLOCK_SIZE
) -> Iterator[Trace]:
    """Traces of one file, parsed lazily (JSONL line by line)."""
    shown = shown or str(path)
    stem = _strip_gz(path.name).rsplit(".", 1)[0]
    if _strip_gz(path.name).endswith(".jsonl"):
        yield from _iter_jsonl(path, shown, stem, dataset, mooncake_block_size)
        return
    obj = _load_json(path, shown)
    if isinstance(obj, list):
        if not obj:
            raise TraceError(f"{shown}: requests: empty trace")
        for k, item in enumerate(obj):
            yield parse_trace(item, f"{shown}[{k}]", default_id=f"{stem}-{k}", dataset=dataset)
    else:
        yield parse_trace(obj, shown, default_id=stem, dataset=dataset)


def _iter_jsonl(path: Path, shown: str, stem: str, dataset: str, mooncake_block_size: int) -> Iterator[Trace]:
    mooncake: bool | None = None
    seen = False
    fh = _open(path, shown)
    with fh:
        for lineno, line in enumerate(_lines(fh, shown, path.name.endswith(".gz")), start=1):
            if not line.strip():
                continue
            where = f"{shown}:{lineno}"
            try:
                obj = _loads(line)
            except (ValueError, RecursionError) as err:
                msg, _, col = _json_problem(line, str(err))
                raise TraceError(f"{shown}: line {lineno}: bad JSON at column {col}: {msg}") from None
            if mooncake is None:
                mooncake = is_mooncake_row(obj)
            seen = True
            if mooncake:
                yield parse_mooncake_row(
                    obj, where, trace_id=f"{stem}-{lineno}", dataset=dataset, block_size=mooncake_block_size
                )
            else:
                yield parse_trace(obj, where, default_id=f"{stem}-{lineno}", dataset=dataset)
    if not seen:
        raise TraceError(f"{shown}: requests: empty trace file")


def resolve_source(source: str | Path) -> tuple[list[tuple[Path, str]], str]:
    """The files a source names (path, name shown in messages) and its dataset name."""
    files, dataset, _ = _resolve(source)
    return files, dataset


def _resolve(source: str | Path) -> tuple[list[tuple[Path, str]], str, list[str]]:
    """resolve_source, plus the symbolic links skipped (as report notes)."""
    text = str(source)
    if text.startswith("hf:"):
        from kv_cache_tester.traces.hf import hf_dataset_dir

        repo_id = text[3:]
        root = hf_dataset_dir(repo_id)
        # The cache's snapshot files are links into the dataset's blobs/ folder two levels up.
        files, skipped = _trace_files(root, text, link_root=root.parent.parent)
        if not files:
            raise TraceError(f"{text}: no .json or .jsonl trace files in the dataset")
        return [(p, f"{text}/{p.relative_to(root).as_posix()}") for p in files], repo_id, skipped
    path = Path(source)
    if not path.exists() and not path.is_symlink():
        raise TraceError(f"{text}: no such file or directory")
    if path.is_dir():
        files, skipped = _trace_files(path, text)
        if not files:
            raise TraceError(
                f"{text}: no .json or .jsonl trace files in this directory" + _skip_note(skipped)
            )
        return [(p, str(p)) for p in files], path.resolve().name, skipped
    if not path.name.endswith(TRACE_SUFFIXES):
        raise TraceError(f"{text}: not a trace file (expected {', '.join(TRACE_SUFFIXES)})")
    return [(path, text)], _strip_gz(path.name).rsplit(".", 1)[0], []


def _skip_note(skipped: list[str]) -> str:
    return (
        f" (skipped {len(skipped)} symbolic links: {skipped[0]}{', ...' if len(skipped) > 1 else ''})"
        if skipped
        else ""
    )


def _trace_files(root: Path, shown: str, link_root: Path | None = None) -> tuple[list[Path], list[str]]:
    """Trace files below ``root`` in sorted order, and the symbolic links skipped.

    Hidden names are left out. A link is followed only to a file inside ``link_root`` (default:
    ``root``); links to directories are never entered. A folder that cannot be listed is an error,
    not a silently smaller dataset.
    """
    inside = Path(os.path.realpath(link_root or root))
    found: list[Path] = []
    skipped: list[str] = []

    def unreadable(err: OSError) -> None:
        where = err.filename or root
        raise TraceError(f"{where}: cannot list: {err.strerror or err}")

    for folder, dirnames, filenames in os.walk(root, onerror=unreadable):
        here = Path(folder)
        entered = []
        for name in sorted(dirnames):
            if name.startswith("."):
                continue
            if (here / name).is_symlink():
                skipped.append(f"{(here / name).relative_to(root).as_posix()} (a link to a directory)")
                continue
            entered.append(name)
        dirnames[:] = entered
        for name in filenames:
            if name.startswith(".") or not name.endswith(TRACE_SUFFIXES):
                continue
            path = here / name
            if path.is_symlink() and not path.exists():
                raise TraceError(f"{path}: broken symbolic link (to {os.readlink(path)!r})")
            if path.is_symlink() and not Path(os.path.realpath(path)).is_relative_to(inside):
                skipped.append(f"{path.relative_to(root).as_posix()} (leads outside {shown})")
                continue
            found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix()), sorted(skipped)


def iter_traces(source: str | Path, *, mooncake_block_size: int = MOONCAKE_BLOCK_SIZE) -> Iterator[Trace]:
    """Every trace of a source, unfiltered, one file at a time."""
    files, dataset = resolve_source(source)
    for path, shown in files:
        yield from iter_file(path, shown=shown, dataset=dataset, mooncake_block_size=mooncake_block_size)


def load_traces(
    source: str | Path,
    *,
    max_context: int | None = None,
    max_context_mode: MaxContextMode = "drop",
    min_requests: int = 1,
    mooncake_block_size: int = MOONCAKE_BLOCK_SIZE,
) -> LoadResult:
    """Load, validate and filter a trace source. Raises :class:`TraceError` on bad input.

    Trace ids are made unique (a repeated id gets ``~2``, ``~3``...; reported) because the id is the
    content scope of local hash ids. Zero traces left after filtering is an error.
    """
    if max_context_mode not in ("drop", "truncate"):
        raise TraceError(f"{source}: max_context_mode: expected drop or truncate, got {max_context_mode!r}")
    if max_context is not None and max_context < 1:
        raise TraceError(f"{source}: max_context: must be a positive integer, got {max_context}")
    files, dataset, skipped = _resolve(source)
    report = FilterReport(skipped_links=skipped)
    traces: list[Trace] = []
    seen: dict[str, int] = {}
    for path, shown in files:
        for trace in iter_file(path, shown=shown, dataset=dataset, mooncake_block_size=mooncake_block_size):
            count = seen.get(trace.trace_id, 0) + 1
            seen[trace.trace_id] = count
            if count > 1:
                new_id = f"{trace.trace_id}~{count}"
                report.renamed_duplicates[new_id] = trace.trace_id
                trace.trace_id = new_id
            traces.append(trace)
    report.traces_in = len(traces)
    report.requests_in = sum(t.num_requests for t in traces)
    kept = apply_filters(
        traces, report, max_context=max_context, max_context_mode=max_context_mode, min_requests=min_requests
    )
    if not kept:
        raise TraceError(f"{source}: no traces left after filters ({'; '.join(report.lines()[1:])})")
    return LoadResult(
        traces=kept, report=report, source=str(source), dataset=dataset, files=[s for _, s in files]
    )
