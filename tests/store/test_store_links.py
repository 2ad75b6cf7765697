"""Nothing is read from outside a result directory: a link (router.json to /proc/self/environ, a
steps folder leading elsewhere) or a FIFO in a result directory is named by `verify`, refused by
`results ingest`, and not one byte of what it points at reaches the store, whatever the receipt
says (an attacker recomputes the receipt entry of a link as easily as of a file)."""

from __future__ import annotations

import contextlib
import os
import threading
import zlib
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.collect.aggregate import load_cell
from agentsweep.collect.discover import find_cells
from agentsweep.contract.receipt import verify
from agentsweep.errors import InputError
from agentsweep.store import schema
from agentsweep.store.db import Store
from agentsweep.store.result_files import read_parts
from sqlalchemy import select

from ..collect.conftest import Spec, write_cell
from .conftest import seal

SECRET = b"PGPASSWORD=hunter2-not-for-the-store\nHF_TOKEN=hf_secret_token_value\n"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside every result directory, as /proc/self/environ or /etc/passwd would be."""
    path = tmp_path / "outside" / "environ"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def _cell(root: Path, users: int = 4) -> Path:
    path = write_cell(root, Spec(users=users))
    seal(path)
    return path


def _linked(root: Path, secret: Path, name: str = "router.json") -> Path:
    """A sealed cell whose ``name`` is then swapped for a link to ``secret`` and sealed again."""
    path = _cell(root)
    target = path / name
    target.unlink(missing_ok=True)
    target.symlink_to(secret)
    seal(path)  # the receipt now lists the link, as anyone preparing results can make it
    return path


def _stored_bytes(db_url: str) -> bytes:
    """Every byte the store holds in its tables (blobs decompressed), for a substring search."""
    store = Store.open(db_url)
    out = bytearray()
    with store.read() as conn:
        for table in schema.metadata.sorted_tables:
            for row in conn.execute(select(table)):
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        raw = bytes(value)
                        with contextlib.suppress(zlib.error):  # a blob part: its raw bytes
                            raw = zlib.decompress(raw)
                        out += raw
                    elif value is not None:
                        out += str(value).encode()
    return bytes(out)


def test_verify_names_a_link_the_receipt_lists(tmp_path, secret, capsys):
    path = _linked(tmp_path / "art", secret)
    problems = verify(path)
    assert [(p.kind, p.path) for p in problems] == [("link", "router.json")]
    assert main(["verify", str(tmp_path / "art")]) == 2
    err = capsys.readouterr().err
    assert f"{path / 'router.json'}: link: a symbolic link (to {str(secret)!r})" in err
    assert "hunter2" not in err


def test_verify_names_a_linked_folder_and_does_not_walk_it(tmp_path, secret):
    path = _cell(tmp_path / "art")
    (path / "steps").symlink_to(secret.parent, target_is_directory=True)
    seal(path)
    assert [(p.kind, p.path) for p in verify(path)] == [("link", "steps")]


def test_verify_names_a_fifo_without_blocking_on_it(tmp_path):
    path = _cell(tmp_path / "art")
    (path / "status.txt").unlink()  # a file the receipt lists, now a FIFO
    os.mkfifo(path / "status.txt")
    found: list = []
    worker = threading.Thread(target=lambda: found.append(verify(path)), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "verify blocked on a FIFO"
    assert [(p.kind, p.path) for p in found[0]] == [("not a file", "status.txt")]


@pytest.mark.parametrize("name", ["router.json", "requests.jsonl", "summary.json", "server_metrics.csv"])
def test_ingest_refuses_a_link_and_stores_no_byte_of_its_target(tmp_path, secret, db_url, name, capsys):
    assert main(["results", "ingest", "--db", db_url, str(_cell(tmp_path / "first", users=2))]) == 0
    root = tmp_path / "art"
    path = _linked(root, secret, name)
    assert main(["results", "ingest", "--db", db_url, str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{path / name}: link: a symbolic link" in err and "refused" in err
    stored = _stored_bytes(db_url)
    assert b"hunter2" not in stored and b"hf_secret" not in stored
    assert str(secret).encode() not in stored


def test_the_store_reader_refuses_a_link_even_past_the_receipt(tmp_path, secret):
    path = _linked(tmp_path / "art", secret, "requests.jsonl")
    with pytest.raises(InputError, match="a symbolic link"):
        list(read_parts(path / "requests.jsonl", 1 << 20))


def test_collect_does_not_read_through_a_linked_summary(tmp_path):
    real = _cell(tmp_path / "art", users=2)
    other = _cell(tmp_path / "art", users=4)
    (other / "summary.json").unlink()
    (other / "summary.json").symlink_to(real / "summary.json")

    def row():
        return next(load_cell(c) for c in find_cells(tmp_path / "art") if c.path == other)

    # Checked against its receipt first: the link is named there.
    assert row().status == "MALFORMED" and "summary.json: link: a symbolic link" in (row().reason or "")
    # Without receipts (an older sweep), the reader itself refuses to follow it.
    for path in (real, other):
        (path / "receipt.json").unlink()
    assert row().status == "MALFORMED"
    assert "summary.json: a symbolic link" in (row().reason or "")
