"""receipt.json: what a result directory held when its cell ended, and what produced it.

The cell writes it last (``write_receipt``), after its verdict: the sha256 and size of every other
file of the result directory (sub-folders such as ``steps/<n>/`` included; every one of them a file
the result directory's owner declares, ``agentsweep.contract.resultdir.files``), the recipe
fingerprint, the replayer's version and the project's git commit. ``verify`` recomputes the file table and names every file that
changed, went missing or was added since, and every number in a JSON, JSON-lines or CSV file that is
not finite (NaN, Infinity): such a number in a result file is a bug of its writer, never a measurement.

The recipe fingerprint identifies *how* a point was measured, whatever its load: sha256 of the
canonical cell without ``users`` and ``exp_name``, together with the engine version, the image and the
client version. Two points with the same fingerprint differ only in their concurrency (and in when
they ran); the results store keys curves and idempotent ingest on it and on the receipt's ``id``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from kv_cache_tester.inputfiles import InputFileProblem, check_regular, open_regular
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentsweep.contract.cell import Cell, flat_fields
from agentsweep.contract.errors import validation_message
from agentsweep.contract.resultdir.fileio import exists, read_bytes, write_atomic
from agentsweep.contract.resultdir.files import RECEIPT_JSON, RECEIPT_JSON_MAX_BYTES
from agentsweep.errors import InputError, ResultFileError

SCHEMA_VERSION = 1
RECEIPT_FILE = RECEIPT_JSON
# Cell fields left out of the recipe fingerprint: the load and the name that encodes it.
FINGERPRINT_EXCLUDED = ("users", "exp_name")
MAX_RECEIPT_BYTES = RECEIPT_JSON_MAX_BYTES
HASH_CHUNK = 1 << 20
SHA256 = re.compile(r"^[0-9a-f]{64}$")
COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
# Files whose numbers are checked for NaN/Infinity, by suffix.
JSON_SUFFIXES = (".json",)
JSONL_SUFFIXES = (".jsonl",)
CSV_SUFFIXES = (".csv",)


class ReceiptError(InputError):
    """A result directory has no readable receipt, or does not match it. Message: ``<path>: <what>``."""

    prefix = "receipt error"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class FileEntry(_Frozen):
    """One file of the result directory as the cell left it."""

    sha256: Annotated[str, Field(pattern=SHA256.pattern)]
    size: Annotated[int, Field(ge=0)]


class Recipe(_Frozen):
    """What besides the cell went into the recipe fingerprint."""

    engine_version: str | None
    image: str
    client: str
    client_version: str | None


class Receipt(_Frozen):
    """The content of receipt.json."""

    schema_version: Literal[1] = 1
    # Relative POSIX paths (``steps/0/summary.json``), sorted; receipt.json itself is not listed.
    files: dict[str, FileEntry]
    recipe_fingerprint: Annotated[str, Field(pattern=SHA256.pattern)]
    recipe: Recipe
    replayer_version: str | None
    commit: str | None  # the project's git commit the cell ran; None when it could not be told
    created_utc: str

    @property
    def id(self) -> str:
        """What identifies this result: sha256 over everything but the time the receipt was written.

        Writing the receipt again over the same files gives the same id (ingest is idempotent on it).
        """
        body = self.model_dump(mode="json", exclude={"created_utc"})
        return hashlib.sha256(_canonical(body).encode()).hexdigest()

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _recipe_fields(cell: Cell | Mapping[str, Any]) -> dict[str, Any]:
    """The cell as the fingerprint sees it: typed and complete, or (a cell refused before it could be
    typed) the mapping it was given."""
    fields = cell.flat() if isinstance(cell, Cell) else flat_fields(cell)
    return {k: v for k, v in fields.items() if k not in FINGERPRINT_EXCLUDED}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def recipe_fingerprint(
    cell: Cell | Mapping[str, Any], *, engine_version: str | None, client_version: str | None
) -> str:
    """sha256 of the canonical cell minus users and exp_name, with engine version, image and client
    version (the image is a cell field; it is named again so the fingerprint's inputs read plainly)."""
    fields = _recipe_fields(cell)
    body = {
        "cell": fields,
        "engine_version": engine_version,
        "image": _text(fields.get("image")),
        "client_version": client_version,
    }
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


def _walk(result_dir: Path) -> Iterator[tuple[str, Path]]:
    """(relative POSIX path, path) of every entry below ``result_dir`` but receipt.json, sorted.

    Links are not followed (a link is an entry of its own, hashed by its target's text).
    """
    for dirpath, dirnames, filenames in os.walk(result_dir):
        dirnames.sort()
        here = Path(dirpath)
        for name in sorted(filenames + [d for d in dirnames if (here / d).is_symlink()]):
            path = here / name
            rel = path.relative_to(result_dir).as_posix()
            if rel == RECEIPT_FILE:
                continue
            yield rel, path


def file_entry(path: Path) -> FileEntry:
    """sha256 and size of a regular file, read in chunks; a link hashes as its target's text."""
    digest = hashlib.sha256()
    if path.is_symlink():
        data = os.readlink(path).encode()
        digest.update(b"link:" + data)
        return FileEntry(sha256=digest.hexdigest(), size=len(data))
    size = 0
    # Never blocks or follows: a link, a FIFO, a device or a socket is refused (InputFileProblem).
    with open_regular(path, follow_links=False) as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return FileEntry(sha256=digest.hexdigest(), size=size)


def file_table(result_dir: Path) -> dict[str, FileEntry]:
    """Every file of the result directory (receipt.json aside) with its sha256 and size."""
    return {rel: file_entry(path) for rel, path in _walk(result_dir)}


def project_commit() -> str | None:
    """The git commit of this checkout: $GITHUB_SHA in a workflow, else the HEAD of the repository
    the package lives in, read from its files (no git process: a cell refused in a unit test, or a
    node without git, still gets its receipt); None when neither tells (an installed copy)."""
    sha = os.environ.get("GITHUB_SHA", "").strip().lower()
    if COMMIT.match(sha):
        return sha
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for folder in Path(__file__).resolve().parents:
            dot_git = folder / ".git"
            if dot_git.exists():
                return _head_commit(dot_git)
    return None


def _head_commit(dot_git: Path) -> str | None:
    """HEAD's commit from a ``.git`` folder, or the ``gitdir:`` file of a worktree."""
    git_dir = dot_git
    if dot_git.is_file():
        text = dot_git.read_text(encoding="utf-8").strip()
        if not text.startswith("gitdir:"):
            return None
        git_dir = (dot_git.parent / text.removeprefix("gitdir:").strip()).resolve()
    common = git_dir
    if (git_dir / "commondir").is_file():  # a worktree keeps its refs in the main repository
        common = (git_dir / (git_dir / "commondir").read_text(encoding="utf-8").strip()).resolve()
    head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    for _ in range(5):  # a symbolic ref to a symbolic ref ..., not forever
        if not head.startswith("ref:"):
            return head.lower() if COMMIT.match(head.lower()) else None
        ref = head.removeprefix("ref:").strip()
        for base in (git_dir, common):
            if (base / ref).is_file():
                head = (base / ref).read_text(encoding="utf-8").strip()
                break
        else:
            return _packed_ref(common / "packed-refs", ref)
    return None


def _packed_ref(packed: Path, ref: str) -> str | None:
    if not packed.is_file():
        return None
    for line in packed.read_text(encoding="utf-8").splitlines():
        sha, _, name = line.partition(" ")
        if name == ref and COMMIT.match(sha):
            return sha
    return None


def replayer_version() -> str | None:
    """The installed trace replayer's version (None when it is not importable here)."""
    try:
        import kv_cache_tester
    except ImportError:
        return None
    version = getattr(kv_cache_tester, "__version__", None)
    return str(version) if version else None


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def build_receipt(
    result_dir: Path,
    cell: Cell | Mapping[str, Any],
    *,
    engine_version: str | None,
    client_version: str | None = None,
    replayer: str | None = None,
    commit: str | None = None,
) -> Receipt:
    """The receipt of ``result_dir`` as it is now (nothing is written).

    ``cell`` is the typed cell, or the mapping a cell refused for bad input was given (its
    fingerprint then covers what it was given). ``client_version`` defaults to the replayer's version
    for cells whose client is the replayer; ``replayer`` to the installed replayer's; ``commit`` to
    ``project_commit()``.
    """
    replayer = replayer if replayer is not None else replayer_version()
    fields = _recipe_fields(cell)
    client = _text(fields.get("client")) or ("replay" if isinstance(cell, Cell) else "")
    if client_version is None and client == "replay":
        client_version = replayer
    return Receipt(
        files=file_table(result_dir),
        recipe_fingerprint=recipe_fingerprint(
            cell, engine_version=engine_version, client_version=client_version
        ),
        recipe=Recipe(
            engine_version=engine_version,
            image=_text(fields.get("image")),
            client=client,
            client_version=client_version,
        ),
        replayer_version=replayer,
        commit=commit if commit is not None else project_commit(),
        created_utc=utc_now(),
    )


def write_receipt(
    result_dir: Path,
    cell: Cell | Mapping[str, Any],
    *,
    engine_version: str | None,
    client_version: str | None = None,
    replayer: str | None = None,
    commit: str | None = None,
) -> Receipt:
    """Write ``result_dir/receipt.json`` (atomically) over the directory as it is now; call it last,
    once nothing else writes there. Returns the receipt written."""
    receipt = build_receipt(
        result_dir,
        cell,
        engine_version=engine_version,
        client_version=client_version,
        replayer=replayer,
        commit=commit,
    )
    write_atomic(result_dir / RECEIPT_FILE, receipt.to_json())
    return receipt


def read_receipt(result_dir: Path) -> Receipt:
    """``result_dir/receipt.json`` as a Receipt; ReceiptError naming the file and what is wrong."""
    path = result_dir / RECEIPT_FILE
    try:
        raw = read_bytes(result_dir, RECEIPT_FILE)
    except ResultFileError as err:
        raise ReceiptError(f"{result_dir}/{err}") from None
    if raw is None:
        raise ReceiptError(f"{path}: no receipt (the cell did not finish writing its result)")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ReceiptError(f"{path}: not JSON ({err})") from None
    if isinstance(data, dict) and data.get("schema_version") != SCHEMA_VERSION:
        raise ReceiptError(
            f"{path}: schema_version {data.get('schema_version')!r}, this agentsweep reads {SCHEMA_VERSION}"
        )
    try:
        return Receipt.model_validate(data, strict=False)
    except ValidationError as err:
        field, what = validation_message(err, Receipt)
        raise ReceiptError(f"{path}: {field + ': ' if field else ''}{what}") from None


@dataclass(frozen=True)
class Problem:
    """One way a result directory departs from its receipt."""

    kind: Literal["changed", "missing", "extra", "non-finite", "link", "not a file"]
    path: str  # relative to the result directory
    detail: str

    def line(self, result_dir: Path) -> str:
        return f"{result_dir / self.path}: {self.kind}: {self.detail}"


def _not_regular(path: Path, rel: str) -> Problem | None:
    """A link or anything but a regular file, as a Problem: a result directory holds regular files
    only, so nothing is followed out of it (a link to /proc/self/environ) and nothing blocks its
    reader (a FIFO)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as err:
        return Problem("changed", rel, f"unreadable ({err.strerror or err})")
    if stat.S_ISLNK(mode):
        return Problem(
            "link", rel, f"a symbolic link (to {os.readlink(path)!r}); result files are regular files"
        )
    if not stat.S_ISREG(mode):
        try:
            check_regular(path, follow_links=False)
        except InputFileProblem as err:  # names what it is: a FIFO, a device, a socket
            return Problem("not a file", rel, f"{err}; not read")
        return Problem("not a file", rel, "not a regular file; not read")
    return None


def compare_files(receipt: Receipt, result_dir: Path) -> list[Problem]:
    """Changed, missing and extra files against the receipt, and every entry that is not a regular
    file (a link, a FIFO) whatever the receipt says, in path order."""
    problems: list[Problem] = []
    seen = {rel for rel, _ in _walk(result_dir)}
    for rel in sorted(set(receipt.files) | seen):
        want = receipt.files.get(rel)
        odd = _not_regular(result_dir / rel, rel) if rel in seen else None
        if odd is not None:
            problems.append(odd)
            continue
        if want is None:
            problems.append(Problem("extra", rel, "not in the receipt (added after the cell ended)"))
            continue
        if rel not in seen:
            problems.append(Problem("missing", rel, f"in the receipt ({want.size} bytes) but gone"))
            continue
        try:
            have = file_entry(result_dir / rel)
        except InputFileProblem as err:
            problems.append(Problem("changed", rel, str(err)))
            continue
        if have != want:
            size = f"size {want.size} -> {have.size}" if have.size != want.size else f"size {have.size}"
            problems.append(Problem("changed", rel, f"sha256 differs from the receipt ({size})"))
    return problems


_NONFINITE_CSV = re.compile(r"^[+-]?(nan|inf|infinity)$", re.IGNORECASE)


def _reject_constant(name: str) -> Any:
    raise _NonFinite(name)


class _NonFinite(ValueError):
    pass


def _json_nonfinite(data: bytes) -> str | None:
    """The first NaN/Infinity literal JSON ``data`` holds, or None (also None when it is not JSON)."""
    if b"NaN" not in data and b"Infinity" not in data:
        return None
    try:
        json.loads(data, parse_constant=_reject_constant)
    except _NonFinite as err:
        return str(err)
    except ValueError:
        return None
    return None


def nonfinite_numbers(path: Path, rel: str) -> list[Problem]:
    """NaN or Infinity in a JSON, JSON-lines or CSV file (the first per file, with its place)."""
    name = path.name.lower()
    try:
        if name.endswith(JSON_SUFFIXES):
            with open_regular(path, follow_links=False) as fh:
                found = _json_nonfinite(fh.read())
            return [Problem("non-finite", rel, f"holds {found}")] if found else []
        if name.endswith(JSONL_SUFFIXES):
            with open_regular(path, follow_links=False) as fh:
                for lineno, raw in enumerate(fh, start=1):
                    found = _json_nonfinite(raw)
                    if found:
                        return [Problem("non-finite", rel, f"line {lineno} holds {found}")]
            return []
        if name.endswith(CSV_SUFFIXES):
            return _csv_nonfinite(path, rel)
    except OSError as err:
        return [Problem("changed", rel, f"unreadable ({err.strerror or err})")]
    except InputFileProblem as err:
        return [Problem("changed", rel, str(err))]
    return []


def _csv_nonfinite(path: Path, rel: str) -> list[Problem]:
    with io.TextIOWrapper(open_regular(path, follow_links=False), encoding="utf-8", errors="replace") as fh:
        header = fh.readline().rstrip("\r\n").split(",")
        for lineno, line in enumerate(fh, start=2):
            lowered = line.lower()
            if "nan" not in lowered and "inf" not in lowered:
                continue
            for i, cell in enumerate(line.rstrip("\r\n").split(",")):
                if _NONFINITE_CSV.match(cell.strip()):
                    column = header[i] if i < len(header) else f"column {i + 1}"
                    return [Problem("non-finite", rel, f"line {lineno}, {column}: {cell.strip()}")]
    return []


def verify(result_dir: Path) -> list[Problem]:
    """Every departure of ``result_dir`` from its receipt, and every non-finite number in its data
    files. Raises ReceiptError when there is no readable receipt."""
    receipt = read_receipt(result_dir)
    problems = compare_files(receipt, result_dir)
    broken = {p.path for p in problems}
    for rel, path in _walk(result_dir):
        if rel not in broken and not path.is_symlink():
            problems.extend(nonfinite_numbers(path, rel))
    return problems


class ReceiptMismatch(InputError):
    """A result directory does not match its receipt, or its receipt cannot be read (what `agentsweep
    verify` says of it). Message: the first problem, relative to the directory, and how many more."""


def checked_receipt(result_dir: Path) -> Receipt | None:
    """The receipt of ``result_dir`` once the directory is checked against it; None when it has none
    (an older result). ReceiptMismatch when the receipt cannot be read, or when a file changed, went
    missing, was added or cannot be read since the cell ended, or a data file holds a non-finite
    number."""
    if not exists(result_dir / RECEIPT_FILE):
        return None
    try:
        receipt = read_receipt(result_dir)
        problems = verify(result_dir)
    except ReceiptError as err:
        raise ReceiptMismatch(str(err).replace(f"{result_dir}/", "", 1)) from None
    except OSError as err:
        where = Path(err.filename).relative_to(result_dir) if err.filename else result_dir.name
        raise ReceiptMismatch(f"{where}: unreadable ({err.strerror or err})") from None
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ReceiptMismatch(
            f"does not match its {RECEIPT_FILE}: {first.path}: {first.kind}: {first.detail}{more}"
        )
    return receipt
