"""Add result directories to the store: checked against their receipts, one transaction, idempotent.

A source is a folder holding cell result directories (a collected sweep in the download-artifact or
local layout, or one cell's directory), or artifact zips as GitHub serves them (``<artifact>.zip``
with the artifact's files at its root; ``gh run download`` leaves them extracted instead). Each
source becomes one run of the store.

Before anything is written every result directory must have a receipt and match it: a changed,
missing or added file refuses the whole ingest, naming the file. A capacity cell's steps are result
directories of their own (with receipts), each a point noted as its cell's step. A point whose
receipt id is in the store already is skipped (ingesting twice adds nothing). Everything else goes in
one transaction.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import tempfile
import zipfile
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from kv_cache_tester.inputfiles import size_text
from pydantic import ValidationError
from sqlalchemy import Connection, insert, select

from agentsweep.contract.receipt import (
    MAX_RECEIPT_BYTES,
    RECEIPT_FILE,
    Receipt,
    ReceiptError,
    compare_files,
    read_receipt,
    utc_now,
)
from agentsweep.contract.resultdir.files import result_file
from agentsweep.errors import InputError
from agentsweep.store import result_files, schema
from agentsweep.store.db import Store
from agentsweep.store.scope import SCOPE_FIELDS, scope_key

PART_BYTES = 4 << 20  # raw bytes per stored part of a kept file
# The most an artifact zip may unpack to (its members' declared sizes summed): a sweep's result
# directories are far smaller; past this the zip is not an artifact of ours (or a zip bomb).
ARTIFACT_MAX_BYTES = 64 << 30
EXTRACT_CHUNK = 1 << 20
ZLIB_LEVEL = 1  # fast: the records compress about 6x at level 1, and level 6 adds only 20 %
IN_CHUNK = 500  # receipt ids per IN (...) lookup
MAX_WORKERS = 4  # processes reading result directories while the main one writes
WORKERS_ENV_VAR = "AGENTSWEEP_INGEST_WORKERS"  # how many (1: read in the main process, no workers)


@dataclass(frozen=True)
class Source:
    """One folder to ingest, and the run it becomes."""

    root: Path
    label: str  # how the run reads in tables (a folder name, "gh run 123")
    origin: str  # where it came from (a path, a workflow run)
    run_key: str | None = None  # a stable key for the run (a workflow run); default: its receipts


@dataclass
class Checked:
    path: Path
    receipt: Receipt
    step_of: str = ""  # a capacity cell's step: that cell's exp_name


@dataclass
class IngestReport:
    runs: list[tuple[str, int, int]] = field(default_factory=list)  # (label, run id, points added)
    skipped: list[str] = field(default_factory=list)  # result dirs already in the store
    unreceipted: list[str] = field(default_factory=list)  # result dirs left out for want of a receipt

    @property
    def added(self) -> int:
        return sum(n for _, _, n in self.runs)


# --- sources ----------------------------------------------------------------------------------


def _safe_member(zip_path: Path, name: str) -> PurePosixPath:
    member = PurePosixPath(name)
    if member.is_absolute() or ".." in member.parts or "\\" in name:
        raise InputError(f"{zip_path}: member {name!r} would land outside the artifact; refused")
    return member


def _zip_receipts(zf: zipfile.ZipFile) -> dict[PurePosixPath, Receipt]:
    """The receipts a zip holds, by the folder they cover (read before anything is extracted; one that
    does not read is left to the check after extraction, which names what is wrong with it)."""
    found: dict[PurePosixPath, Receipt] = {}
    for info in zf.infolist():
        member = PurePosixPath(info.filename)
        if member.name != RECEIPT_FILE or info.is_dir() or info.file_size > MAX_RECEIPT_BYTES:
            continue
        try:
            with zf.open(info) as fh:
                data = json.loads(fh.read(MAX_RECEIPT_BYTES + 1))
            found[member.parent] = Receipt.model_validate(data, strict=False)
        except (ValueError, RecursionError, ValidationError, zipfile.BadZipFile, OSError, zlib.error):
            continue
    return found


def _declared_problem(member: PurePosixPath, size: int, receipts: dict[PurePosixPath, Receipt]) -> str | None:
    """What refuses a member by its declared size alone: more than its file's declared limit, or
    another size (or no entry) than the receipt of its result directory says."""
    for folder, receipt in receipts.items():
        if folder != member.parent and folder not in member.parents:
            continue
        rel = member.relative_to(folder).as_posix()
        if rel == RECEIPT_FILE:
            continue
        entry = receipt.files.get(rel)
        if entry is None:
            where = "the zip root" if folder == PurePosixPath(".") else folder.as_posix()
            return f"not in the receipt of {where} (added after the cell ended)"
        if entry.size != size:
            return f"{size_text(size)}, but the receipt says {entry.size} bytes"
    try:
        limit = result_file(member.name).max_bytes
    except KeyError:
        limit = None
    if limit is not None and size > limit:
        return f"{size_text(size)} is over the {size_text(limit)} limit of {member.name}"
    return None


def extract_artifact_zip(zip_path: Path, into: Path) -> Path:
    """Extract one artifact zip into ``into/<zip stem>/``.

    Everything is checked before a byte is written: a member leaving the folder, a member whose declared
    size its file's limit or its result directory's receipt refuses, and the declared sizes together
    (at most ARTIFACT_MAX_BYTES, and what the disk has free). While extracting, a member is cut off and
    refused as soon as it gives more bytes than it declared.
    """
    target = into / zip_path.stem
    try:
        with zipfile.ZipFile(zip_path) as zf:
            infos = zf.infolist()
            members = [(_safe_member(zip_path, info.filename), info) for info in infos]
            receipts = _zip_receipts(zf)
            for member, info in members:
                problem = None if info.is_dir() else _declared_problem(member, info.file_size, receipts)
                if problem:
                    raise InputError(
                        f"{zip_path}: member {info.filename}: {problem}; refused before extraction"
                    )
            total = sum(info.file_size for info in infos)
            free = shutil.disk_usage(into).free
            if total > min(ARTIFACT_MAX_BYTES, free):
                why = (
                    f"the {size_text(ARTIFACT_MAX_BYTES)} limit"
                    if total > ARTIFACT_MAX_BYTES
                    else (f"the {size_text(free)} free at {into}")
                )
                raise InputError(
                    f"{zip_path}: unpacks to {size_text(total)}, over {why}; refused before extraction"
                )
            for member, info in members:
                _extract(zf, info, target / member, zip_path)
    except zipfile.BadZipFile as err:
        raise InputError(f"{zip_path}: not a zip file ({err})") from None
    except (OSError, zlib.error) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InputError(f"{zip_path}: cannot extract ({why})") from None
    return target


def _extract(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path, zip_path: Path) -> None:
    """One member to ``path`` (a new regular file), never more bytes than it declared."""
    if info.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with zf.open(info) as src, path.open("xb") as dst:
        while chunk := src.read(EXTRACT_CHUNK):
            written += len(chunk)
            if written > info.file_size:
                raise InputError(
                    f"{zip_path}: member {info.filename}: more than the {info.file_size} bytes it declares; "
                    "refused"
                )
            dst.write(chunk)


@contextlib.contextmanager
def expanded(source: Source) -> Iterator[list[Path]]:
    """The folders to search: the source itself (when a folder) and every artifact zip in it (or the
    zip it is) extracted to a temporary folder, removed afterwards."""
    root = source.root
    if root.is_file() and root.suffix == ".zip":
        roots, zips = [], [root]
    elif root.is_dir():
        roots, zips = [root], sorted(p for p in root.rglob("*.zip") if p.is_file())
    else:
        raise InputError(f"{root}: no such folder or artifact zip")
    if not zips:
        yield roots
        return
    with tempfile.TemporaryDirectory(prefix="agentsweep-ingest-") as tmp:
        for zip_path in zips:
            extract_artifact_zip(zip_path, Path(tmp))
        yield [*roots, Path(tmp)]


# --- checks -----------------------------------------------------------------------------------


def check_source(
    source: Source, roots: Sequence[Path], unreceipted: list[str] | None = None
) -> list[Checked]:
    """Every result directory of the source with its receipt; ReceiptError for the first that no
    longer matches it, or that has none (unless ``unreceipted`` is given: then its line goes there)."""
    found = [cell for root in roots for cell in result_files.find_result_cells(root)[0]]
    if not found:
        raise InputError(f"{source.origin}: no cell result directories found (looked for cell.json...)")
    checked = []
    for cell in found:
        path = cell.path
        if unreceipted is not None and not (path / RECEIPT_FILE).exists():
            unreceipted.append(f"{path / RECEIPT_FILE}: no receipt; not ingested")
            continue
        receipt = read_receipt(path)
        problems = compare_files(receipt, path)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ReceiptError(
                f"{problems[0].line(path)}{more}; refused: the result no longer matches its receipt"
            )
        checked.append(Checked(path, receipt, cell.step_of))
    return checked


def default_run_key(checked: Sequence[Checked]) -> str:
    ids = sorted(c.receipt.id for c in checked)
    return "receipts:" + hashlib.sha256("\n".join(ids).encode()).hexdigest()[:40]


# --- writing ----------------------------------------------------------------------------------


def _known(conn: Connection, ids: Sequence[str]) -> set[str]:
    found: set[str] = set()
    for i in range(0, len(ids), IN_CHUNK):
        chunk = list(ids[i : i + IN_CHUNK])
        rows = conn.execute(select(schema.points.c.receipt_id).where(schema.points.c.receipt_id.in_(chunk)))
        found.update(rows.scalars())
    return found


def _run_id(conn: Connection, run_key: str, source: Source, checked: Sequence[Checked]) -> int:
    existing = conn.execute(select(schema.runs.c.id).where(schema.runs.c.run_key == run_key)).scalar()
    if existing is not None:
        return int(existing)
    commits = sorted({c.receipt.commit for c in checked if c.receipt.commit})
    result = conn.execute(
        insert(schema.runs).values(
            run_key=run_key,
            label=source.label,
            source=source.origin,
            commit=",".join(commits) or None,
            started_utc=None,
            ingested_utc=utc_now(),
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)


@dataclass
class Prepared:
    """What one result directory adds to the store, read and compressed (in a worker process)."""

    facts: result_files.PointFacts
    blobs: list[tuple[str, list[tuple[int, bytes]]]]  # (name, [(raw size, zlib data)] per part)


def prepare(path: Path, names: list[str], step_of: str = "") -> Prepared:
    """Read one result directory: its figures, the files kept whole, its drill-down payload."""
    facts = result_files.read_point(path, step_of)
    blobs = []
    for name in result_files.kept_files(path, names):
        parts = result_files.read_parts(path / name, PART_BYTES)
        blobs.append((name, [(len(raw), zlib.compress(raw, ZLIB_LEVEL)) for raw in parts]))
    payload = result_files.payload_json(result_files.drilldown(facts))
    blobs.append(("drilldown.json", [(len(payload), zlib.compress(payload, ZLIB_LEVEL))]))
    facts.requests = result_files.RequestTimeline()  # drawn into the payload; not sent back
    facts.capacity = None
    return Prepared(facts, blobs)


def ingest_workers() -> int:
    """$AGENTSWEEP_INGEST_WORKERS, else one per CPU up to MAX_WORKERS."""
    text = os.environ.get(WORKERS_ENV_VAR, "").strip()
    if not text:
        return max(1, min(MAX_WORKERS, os.cpu_count() or 1))
    if not text.isdigit() or int(text) < 1:
        raise InputError(f"${WORKERS_ENV_VAR}={text!r}: expected a whole number of processes, 1 or more")
    return int(text)


def prepared(items: Sequence[Checked], workers: int) -> Iterator[tuple[Checked, Prepared]]:
    """Each item with its Prepared, in order; ``workers`` processes read ahead (at most two items
    each in flight, so memory stays bounded). The workers never touch the database."""
    if workers <= 1 or len(items) <= 1:
        for item in items:
            yield item, prepare(item.path, sorted(item.receipt.files), item.step_of)
        return
    context = (
        multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    )
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: deque[tuple[Checked, Future[Prepared]]] = deque()
        queue = iter(items)
        for item in itertools.islice(queue, 2 * workers):
            pending.append((item, pool.submit(prepare, item.path, sorted(item.receipt.files), item.step_of)))
        while pending:
            item, future = pending.popleft()
            following = next(queue, None)
            if following is not None:
                pending.append(
                    (
                        following,
                        pool.submit(
                            prepare, following.path, sorted(following.receipt.files), following.step_of
                        ),
                    )
                )
            yield item, future.result()


def _put_blob(conn: Connection, point_id: int, name: str, parts: list[tuple[int, bytes]]) -> None:
    for i, (raw_size, data) in enumerate(parts):
        conn.execute(
            insert(schema.blobs).values(
                point_id=point_id, name=name, part=i, codec="zlib", raw_size=raw_size, data=data
            )
        )


def _insert_point(conn: Connection, run_id: int, item: Checked, ready: Prepared) -> tuple[int, str | None]:
    facts = ready.facts
    receipt = item.receipt
    cell = facts.cell
    values: dict[str, Any] = {
        "model": cell.get("model") or "",
        "hardware": facts.hardware or cell.get("runner") or "",
        "engine": cell.get("engine") or "",
        "engine_version": facts.engine_version or receipt.recipe.engine_version or "",
        "precision": cell.get("precision") or "",
        "offload": cell.get("offload") or "",
        "router": cell.get("router") or "",
        "shape": facts.shape,
        "replayer_version": receipt.replayer_version or "",
    }
    values = {k: str(v) for k, v in values.items()}
    positions = {}
    for name in ("tp", "ep", "users", "gpus"):
        value = cell.get(name)
        positions[name] = value if isinstance(value, int) and not isinstance(value, bool) else 0
    result = conn.execute(
        insert(schema.points).values(
            run_id=run_id,
            receipt_id=receipt.id,
            recipe_fingerprint=receipt.recipe_fingerprint,
            exp_name=facts.exp_name,
            config_key=str(cell.get("config_key") or ""),
            status=facts.status,
            reason=facts.reason,
            notes="; ".join(facts.notes),
            scope_key=scope_key(values),
            **{name: values[name] for name in SCOPE_FIELDS},
            **positions,
            commit=receipt.commit,
            start_utc=facts.start_utc,
            end_utc=facts.end_utc,
            cell_json=_json(cell),
            validity_json=_json(facts.validity),
            stability_json=_json(
                {
                    "block": facts.stability,
                    "ranges": facts.noise,
                    "throughput_ranges": facts.throughput_noise,
                    "labels": facts.labels,
                    "slo_run": facts.slo_run,
                }
            ),
        )
    )
    key = result.inserted_primary_key
    assert key is not None
    point_id = int(key[0])
    if facts.metrics:
        conn.execute(
            insert(schema.metrics),
            [{"point_id": point_id, "name": k, "value": v} for k, v in sorted(facts.metrics.items())],
        )
    conn.execute(
        insert(schema.files),
        [
            {"point_id": point_id, "path": path, "sha256": entry.sha256, "size": entry.size}
            for path, entry in receipt.files.items()
        ],
    )
    for name, parts in ready.blobs:
        _put_blob(conn, point_id, name, parts)
    return point_id, facts.start_utc


def ingest(store: Store, sources: Sequence[Source], skip_unreceipted: bool = False) -> IngestReport:
    """Check every source, then add what is new in one transaction (see the module docstring).

    ``skip_unreceipted`` leaves out (and lists in the report) result directories that have no
    receipt, such as a cell whose process died before writing one, instead of refusing the ingest.
    """
    report = IngestReport()
    unreceipted = report.unreceipted if skip_unreceipted else None
    workers = ingest_workers()
    with contextlib.ExitStack() as stack:
        plans = []
        for source in sources:
            roots = stack.enter_context(expanded(source))
            plans.append((source, check_source(source, roots, unreceipted)))
        with store.write() as conn:
            known = _known(conn, [c.receipt.id for _, checked in plans for c in checked])
            for source, checked in plans:
                new = []
                for item in checked:
                    if item.receipt.id in known:
                        report.skipped.append(str(item.path))
                    else:
                        known.add(item.receipt.id)
                        new.append(item)
                if not new:
                    continue
                run_id = _run_id(conn, source.run_key or default_run_key(checked), source, checked)
                starts = []
                for item, ready in prepared(new, workers):
                    _, start = _insert_point(conn, run_id, item, ready)
                    if start:
                        starts.append(start)
                before = conn.execute(
                    select(schema.runs.c.started_utc).where(schema.runs.c.id == run_id)
                ).scalar()
                starts += [before] if before else []
                if starts:
                    conn.execute(
                        schema.runs.update().where(schema.runs.c.id == run_id).values(started_utc=min(starts))
                    )
                report.runs.append((source.label, run_id, len(new)))
    return report
