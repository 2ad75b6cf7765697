"""A store that cannot be used is one line naming what and where, exit 2, and nothing half-written."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.store import schema
from agentsweep.store.db import Store
from sqlalchemy import create_engine, insert, inspect

from .conftest import SMALL, make_sweep
from .postgres import free_port


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "art"
    make_sweep(root, SMALL)
    return root


@pytest.fixture
def filled(tmp_path: Path, sweep: Path) -> Path:
    db = tmp_path / "store.db"
    assert main(["results", "ingest", "--db", str(db), str(sweep)]) == 0
    return db


def test_a_file_that_is_not_a_database(tmp_path, sweep, capsys):
    db = tmp_path / "store.db"
    db.write_bytes(b"this is a text file, not SQLite\n" * 100)
    before = _digest(db)
    assert main(["results", "ingest", "--db", str(db), str(sweep)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"store error: {db}: not a readable SQLite database")
    assert main(["results", "runs", "--db", str(db)]) == 2
    assert "not a readable SQLite database" in _one_line(capsys)
    assert _digest(db) == before


def test_a_truncated_database(filled, capsys):
    data = filled.read_bytes()
    filled.write_bytes(data[: len(data) // 3])
    before = _digest(filled)
    for args in (["runs"], ["curves"], ["history", "--metric", "ttft_p90_s"], ["diff", "1", "1"]):
        code = main(["results", *args, "--db", str(filled)])
        line = _one_line(capsys)
        assert code == 2 and line.startswith(f"store error: {filled}: not a readable SQLite database"), line
    assert main(["dashboard", "--db", str(filled), "-o", str(filled.parent / "site")]) == 2
    assert "not a readable SQLite database" in _one_line(capsys)
    assert not (filled.parent / "site").exists()
    assert _digest(filled) == before


def test_a_schema_newer_than_the_code(filled, sweep, capsys):
    with sqlite3.connect(filled) as conn:
        conn.execute("INSERT INTO schema_version VALUES (99, '2030-01-01T00:00:00Z', 'from the future')")
    before = _digest(filled)
    assert main(["results", "runs", "--db", str(filled)]) == 2
    assert _one_line(capsys) == (
        f"store error: {filled}: schema version 99 is newer than this agentsweep knows (1); "
        "upgrade agentsweep to use it"
    )
    assert main(["results", "ingest", "--db", str(filled), str(sweep)]) == 2
    assert "schema version 99" in _one_line(capsys)
    assert _digest(filled) == before


def test_a_database_that_is_not_a_store(tmp_path, sweep, capsys):
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    assert main(["results", "ingest", "--db", str(db), str(sweep)]) == 2
    assert "not an agentsweep store (it has tables invoices but no schema_version)" in _one_line(capsys)
    with sqlite3.connect(db) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["invoices"]


def test_reading_a_store_that_is_not_there_creates_nothing(tmp_path, capsys):
    db = tmp_path / "none.db"
    assert main(["results", "runs", "--db", str(db)]) == 2
    assert "no store here yet" in _one_line(capsys)
    assert not db.exists()


def test_a_failed_ingest_leaves_no_new_file(tmp_path, sweep, capsys):
    (next(sweep.iterdir()) / "receipt.json").unlink()
    db = tmp_path / "new" / "store.db"
    assert main(["results", "ingest", "--db", str(db), str(sweep)]) == 2
    assert "no receipt" in _one_line(capsys)
    assert not db.exists()


@pytest.mark.slow
def test_a_postgresql_url_that_does_not_answer(sweep, capsys):
    url = f"postgresql://agentsweep:secret@127.0.0.1:{free_port()}/results"
    assert main(["results", "ingest", "--db", url, str(sweep)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"store error: postgresql+psycopg://agentsweep:***@127.0.0.1:{url.split(':')[3]}")
    assert "cannot connect" in line and "secret" not in line
    assert main(["results", "runs", "--db", url]) == 2
    assert "cannot connect" in _one_line(capsys)


def test_urls_the_store_does_not_take(capsys):
    assert main(["results", "runs", "--db", "mysql://u@h/db"]) == 2
    assert "runs on SQLite or PostgreSQL, not mysql" in _one_line(capsys)


def test_migrations_build_the_declared_schema(db_url):
    store = Store.open(db_url)
    assert store.migrate() == [1]
    assert store.migrate() == []
    engine = create_engine(store.url)
    found = inspect(engine)
    for table in schema.metadata.sorted_tables:
        columns = {c["name"]: c for c in found.get_columns(table.name)}
        assert sorted(columns) == sorted(c.name for c in table.columns), table.name
        for column in table.columns:
            assert columns[column.name]["nullable"] == column.nullable or column.primary_key, (
                table.name,
                column.name,
            )
        pk = found.get_pk_constraint(table.name)["constrained_columns"]
        assert sorted(pk) == sorted(c.name for c in table.primary_key.columns), table.name
    engine.dispose()
    store.dispose()


def test_an_older_schema_is_brought_up_by_an_ingest_not_by_a_read(tmp_path, capsys, monkeypatch):
    """A store at version 0 of a later code (simulated: schema_version empty of the newest row)."""
    db = tmp_path / "store.db"
    store = Store.open(str(db))
    store.migrate()
    with store.engine.begin() as conn:
        conn.execute(schema.schema_version.delete())
        conn.execute(insert(schema.schema_version).values(version=1, applied_utc="x", description="x"))
    store.dispose()
    from agentsweep.store import db as db_module

    monkeypatch.setattr(db_module, "LATEST", 2)
    assert main(["results", "runs", "--db", str(db)]) == 2
    assert "schema version 1, this agentsweep reads 2; run `agentsweep results migrate`" in _one_line(capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["diff", "1", "1", "--metric", "ttft_p9O_s", "--check"],
        ["diff", "1", "1", "--metric", "ttft_p90_s", "--metric", "ttft_p9O_s"],
        ["history", "--metric", "ttft_p9O_s"],
        ["curves", "--metric", "ttft_p9O_s"],
    ],
    ids=["diff --check", "diff, second metric", "history", "curves"],
)
def test_an_unknown_metric_is_one_line_naming_close_ones(filled, capsys, argv):
    """A misspelt metric compared nothing, and `diff --check` passed on it: it is refused."""
    assert main(["results", *argv, "--db", str(filled)]) == 2
    assert _one_line(capsys) == (
        "input error: --metric 'ttft_p9O_s': no such metric; did you mean ttft_p99_s, ttft_p95_s, ttft_p90_s?"
    )
    assert main(["results", "diff", "1", "1", "--metric", "ttft_p90_s", "--check", "--db", str(filled)]) == 0


def test_control_characters_in_a_label_print_escaped(tmp_path, sweep, capsys):
    db = tmp_path / "store.db"
    label = "night\x1b[31m red\rX\u202e"
    assert main(["results", "ingest", "--db", str(db), str(sweep), "--label", label]) == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err and "(night\\x1b[31m red\\rX\\u202e)" in err
    assert main(["results", "runs", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert "night\\x1b[31m red\\rX\\u202e" in out.splitlines()[2]
    assert main(["results", "diff", "1", "1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("base: run 1 (night\\x1b[31m red\\rX\\u202e), head: run 1 (night\\x1b")
    assert main(["results", "diff", "nope", "1", "--db", str(db)]) == 2  # the error lists the runs
    line = _one_line(capsys)
    assert "\x1b" not in line and "1 (night\\x1b[31m red\\rX\\u202e)" in line
