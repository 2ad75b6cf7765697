"""Numbered schema migrations, applied in order, each once, inside the caller's transaction.

Each module ``m<NNNN>_<what>.py`` has ``VERSION``, ``DESCRIPTION`` and ``upgrade(conn)``; it states
its DDL in full with SQLAlchemy Core (never importing ``store.schema``, which always describes the
newest version), so an old database and a new one end up with the same tables. ``schema_version``
gets one row per migration applied. docs/store.md says why this and not Alembic.
"""

from __future__ import annotations

from types import ModuleType

from agentsweep.store.migrations import m0001_initial

MIGRATIONS: tuple[ModuleType, ...] = (m0001_initial,)
LATEST = MIGRATIONS[-1].VERSION

assert [m.VERSION for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1)), "migrations out of order"
