"""The store's tables as the code reads and writes them (the current schema version).

The migrations in ``migrations/`` create and change these tables; a test checks that a database
brought up by every migration has exactly the columns declared here.

- ``runs``: one per ingested sweep (a folder of result directories, or a workflow run's artifacts).
- ``points``: one per cell result directory, unique on its receipt id; its scope columns (the curve
  it belongs to), its identity within the scope (tp, ep, users, gpus), run, commit and dates.
- ``metrics``: the point's figures, one row per (point, name); the names are collect's summary.csv
  columns (docs/collect.md), in the engine's clock.
- ``files``: the receipt's file table (path, sha256, size) of each point.
- ``blobs``: compressed file contents kept for drill-down (requests.jsonl, the metrics CSVs, the
  router files, capacity.json) and the derived drill-down series, in parts of a few MiB.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_utc", String(32), nullable=False),
    Column("description", Text, nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("run_key", String(200), nullable=False, unique=True),
    Column("label", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("commit", String(64)),
    Column("started_utc", String(32)),
    Column("ingested_utc", String(32), nullable=False),
)

points = Table(
    "points",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("run_id", Integer, ForeignKey("runs.id"), nullable=False),
    Column("receipt_id", String(64), nullable=False, unique=True),
    Column("recipe_fingerprint", String(64), nullable=False),
    Column("exp_name", Text, nullable=False),
    Column("config_key", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("notes", Text, nullable=False),
    # The scope: which curve the point lies on.
    Column("scope_key", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("hardware", Text, nullable=False),
    Column("engine", Text, nullable=False),
    Column("engine_version", Text, nullable=False),
    Column("precision", Text, nullable=False),
    Column("offload", Text, nullable=False),
    Column("router", Text, nullable=False),
    Column("shape", Text, nullable=False),
    Column("replayer_version", Text, nullable=False),
    # Where on the curve.
    Column("tp", Integer, nullable=False),
    Column("ep", Integer, nullable=False),
    Column("users", Integer, nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("commit", String(64)),
    Column("start_utc", String(32)),
    Column("end_utc", String(32)),
    Column("cell_json", Text, nullable=False),
    Column("validity_json", Text, nullable=False),
    Column("stability_json", Text, nullable=False),
)
Index("points_scope", points.c.scope_key)
Index("points_run", points.c.run_id)

metrics = Table(
    "metrics",
    metadata,
    Column("point_id", Integer, ForeignKey("points.id"), primary_key=True),
    Column("name", String(120), primary_key=True),
    Column("value", Double, nullable=False),
)

files = Table(
    "files",
    metadata,
    Column("point_id", Integer, ForeignKey("points.id"), primary_key=True),
    Column("path", String(1000), primary_key=True),
    Column("sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
)

blobs = Table(
    "blobs",
    metadata,
    Column("point_id", Integer, ForeignKey("points.id"), primary_key=True),
    Column("name", String(200), primary_key=True),
    Column("part", Integer, primary_key=True, autoincrement=False),
    Column("codec", String(16), nullable=False),
    Column("raw_size", BigInteger, nullable=False),
    Column("data", LargeBinary, nullable=False),
)
