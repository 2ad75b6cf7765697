"""Open the store by URL, keep its schema current, and turn database failures into one line.

``--db`` takes a SQLAlchemy URL (``sqlite:///path.db``, ``postgresql://user@host/db``) or a plain
file path (a SQLite file); without it, ``$AGENTSWEEP_DB``, else ``results/agentsweep.db``. A
``postgresql://`` URL uses the psycopg 3 driver (``agentsweep[postgres]``).

Writing (``Store.write``) is one transaction: the pending migrations and everything the caller does
commit together or not at all. Reading (``Store.read``) never creates or changes anything: a store
that does not exist yet, or whose schema is older or newer than this code's, is refused by name.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from agentsweep.errors import InputError
from agentsweep.store import schema
from agentsweep.store.migrations import LATEST, MIGRATIONS

DEFAULT_DB = Path("results") / "agentsweep.db"
DB_ENV_VAR = "AGENTSWEEP_DB"
POSTGRES_DRIVER = "postgresql+psycopg"
CONNECT_TIMEOUT_S = 10
SQLITE_BUSY_TIMEOUT_S = 60


class StoreError(InputError):
    """The store cannot be used: not there, not a database, unreachable, a schema this code does not
    know. Message: ``<where>: <what>``."""

    prefix = "store error"


class DamagedStore(Exception):
    """A value in the store that does not decode as ingest wrote it (a damaged or edited database).
    Raised by the readers with what and where (``point 3: metric ttft_p90_s: 'abc' is not a
    number``); a store's read turns it into one StoreError line."""


def resolve_url(text: str | None) -> URL:
    """The SQLAlchemy URL ``--db`` names (see the module docstring)."""
    text = text or os.environ.get(DB_ENV_VAR) or str(DEFAULT_DB)
    if "://" not in text:
        return URL.create("sqlite", database=str(Path(text)))
    try:
        url = make_url(text)
    except ArgumentError as err:
        raise StoreError(f"--db {text!r}: not a database URL ({err})") from None
    backend = url.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return url.set(drivername=POSTGRES_DRIVER)
    if backend != "sqlite":
        raise StoreError(f"--db {describe(url)}: the store runs on SQLite or PostgreSQL, not {backend}")
    return url


def describe(url: URL) -> str:
    """The URL without its password (for messages)."""
    if url.get_backend_name() == "sqlite":
        return url.database or ":memory:"
    return url.render_as_string(hide_password=True)


def _first_line(err: BaseException) -> str:
    orig = getattr(err, "orig", None) or err
    text = " ".join(str(orig).split())
    return text[:300] or type(orig).__name__


class Store:
    """One store (one database). Use ``with store.write() as conn`` / ``with store.read() as conn``."""

    def __init__(self, url: URL) -> None:
        self.url = url
        self.where = describe(url)
        self.sqlite_path = Path(url.database) if url.get_backend_name() == "sqlite" and url.database else None
        self._engine: Engine | None = None
        self.applied: list[int] = []  # migrations the last write() applied

    @classmethod
    def open(cls, db: str | None) -> Store:
        return cls(resolve_url(db))

    # --- connections ------------------------------------------------------------------------
    def _make_engine(self) -> Engine:
        if self.sqlite_path is not None:
            engine = create_engine(self.url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

            @event.listens_for(engine, "connect")
            def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
                # The sqlite3 module's own transaction handling leaves DDL outside transactions;
                # the store begins them itself so a migration rolls back with the ingest around it.
                dbapi_conn.isolation_level = None
                dbapi_conn.execute("PRAGMA foreign_keys=ON")

            @event.listens_for(engine, "begin")
            def _sqlite_begin(conn: Connection) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.get("write") else "BEGIN")

            return engine
        try:
            return create_engine(
                self.url,
                connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
                pool_pre_ping=True,
            )
        except (NoSuchModuleError, ModuleNotFoundError):
            raise StoreError(
                f"{self.where}: PostgreSQL needs the psycopg driver: pip install 'agentsweep[postgres]'"
            ) from None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = self._make_engine()
        return self._engine

    def dispose(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Database failures as one StoreError naming the store."""
        try:
            yield
        except StoreError:
            raise
        except DamagedStore as err:
            raise StoreError(f"{self.where}: damaged: {err}; re-create the store from the results") from None
        except (DBAPIError, sqlite3.Error) as err:
            raise StoreError(f"{self.where}: {self._explain(err)}") from None
        except SQLAlchemyError as err:
            raise StoreError(f"{self.where}: {_first_line(err)}") from None
        except ModuleNotFoundError as err:
            if err.name and err.name.startswith("psycopg"):
                raise StoreError(
                    f"{self.where}: PostgreSQL needs the psycopg driver: pip install 'agentsweep[postgres]'"
                ) from None
            raise

    def _explain(self, err: BaseException) -> str:
        text = _first_line(err)
        if self.sqlite_path is not None:
            if "not a database" in text or "malformed" in text:
                return f"not a readable SQLite database ({text}); the file is damaged or is not a store"
            return text
        if getattr(err, "connection_invalidated", False) or "connect" in text.lower():
            return f"cannot connect ({text})"
        return text

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """One transaction that first brings the schema up to date; nothing stays if it fails.

        A SQLite file that did not exist before and ends up with nothing committed is removed.
        """
        created = self.sqlite_path is not None and not self.sqlite_path.exists()
        committed = False
        if self.sqlite_path is not None:
            try:
                self.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise StoreError(f"{self.where}: cannot create its folder ({err.strerror or err})") from None
        try:
            with self._errors(), self.engine.connect() as conn:
                conn.info["write"] = True
                with conn.begin():
                    self.applied = self._migrate(conn)
                    yield conn
                committed = True
        finally:
            if created and not committed:
                self.dispose()
                assert self.sqlite_path is not None
                for suffix in ("", "-journal", "-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        Path(f"{self.sqlite_path}{suffix}").unlink()

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only view at the current schema version."""
        if self.sqlite_path is not None and not self.sqlite_path.exists():
            raise StoreError(f"{self.where}: no store here yet (`agentsweep results ingest` creates it)")
        with self._errors(), self.engine.connect() as conn, conn.begin():
            version = self.version(conn)
            if version is None:
                raise StoreError(f"{self.where}: no store here yet (`agentsweep results ingest` creates it)")
            if version < LATEST:
                raise StoreError(
                    f"{self.where}: schema version {version}, this agentsweep reads {LATEST}; "
                    "run `agentsweep results migrate` (or an ingest) to bring it up to date"
                )
            yield conn

    # --- schema -------------------------------------------------------------------------------
    def version(self, conn: Connection) -> int | None:
        """The schema version, None for an empty database; StoreError for one that is not a store
        or is newer than this code."""
        names = set(inspect(conn).get_table_names())
        if schema.schema_version.name not in names:
            if names:
                raise StoreError(
                    f"{self.where}: not an agentsweep store (it has tables {', '.join(sorted(names)[:5])} "
                    "but no schema_version)"
                )
            return None
        found: list[int] = list(conn.execute(select(schema.schema_version.c.version)).scalars())
        if not found:
            raise StoreError(f"{self.where}: schema_version is empty; not a store this code wrote")
        version = max(found)
        if version > LATEST:
            raise StoreError(
                f"{self.where}: schema version {version} is newer than this agentsweep knows ({LATEST}); "
                "upgrade agentsweep to use it"
            )
        return int(version)

    def _migrate(self, conn: Connection) -> list[int]:
        """Apply every migration the database lacks; returns the versions applied."""
        from agentsweep.contract.receipt import utc_now

        current = self.version(conn) or 0
        applied = []
        if current == 0:
            schema.schema_version.create(conn)
        for migration in MIGRATIONS:
            if current >= migration.VERSION:
                continue
            migration.upgrade(conn)
            conn.execute(
                schema.schema_version.insert().values(
                    version=migration.VERSION, applied_utc=utc_now(), description=migration.DESCRIPTION
                )
            )
            applied.append(migration.VERSION)
        return applied

    def migrate(self) -> list[int]:
        """Bring the schema up to date on its own (``agentsweep results migrate``)."""
        with self.write():
            pass
        return self.applied
