"""Version 1: runs, points, metrics, files, blobs."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
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

VERSION = 1
DESCRIPTION = "runs, points, metrics, files, blobs"


def upgrade(conn: Connection) -> None:
    md = MetaData()
    Table(
        "runs",
        md,
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
        md,
        Column("id", Integer, primary_key=True),
        Column("run_id", Integer, ForeignKey("runs.id"), nullable=False),
        Column("receipt_id", String(64), nullable=False, unique=True),
        Column("recipe_fingerprint", String(64), nullable=False),
        Column("exp_name", Text, nullable=False),
        Column("config_key", Text, nullable=False),
        Column("status", String(16), nullable=False),
        Column("reason", Text, nullable=False),
        Column("notes", Text, nullable=False),
        Column("scope_key", Text, nullable=False),
        *(
            Column(name, Text, nullable=False)
            for name in (
                "model",
                "hardware",
                "engine",
                "engine_version",
                "precision",
                "offload",
                "router",
                "shape",
                "replayer_version",
            )
        ),
        *(Column(name, Integer, nullable=False) for name in ("tp", "ep", "users", "gpus")),
        Column("commit", String(64)),
        Column("start_utc", String(32)),
        Column("end_utc", String(32)),
        Column("cell_json", Text, nullable=False),
        Column("validity_json", Text, nullable=False),
        Column("stability_json", Text, nullable=False),
    )
    Index("points_scope", points.c.scope_key)
    Index("points_run", points.c.run_id)
    Table(
        "metrics",
        md,
        Column("point_id", Integer, ForeignKey("points.id"), primary_key=True),
        Column("name", String(120), primary_key=True),
        Column("value", Double, nullable=False),
    )
    Table(
        "files",
        md,
        Column("point_id", Integer, ForeignKey("points.id"), primary_key=True),
        Column("path", String(1000), primary_key=True),
        Column("sha256", String(64), nullable=False),
        Column("size", BigInteger, nullable=False),
    )
    Table(
        "blobs",
        md,
        Column("point_id", Integer, ForeignKey("points.id"), primary_key=True),
        Column("name", String(200), primary_key=True),
        Column("part", Integer, primary_key=True, autoincrement=False),
        Column("codec", String(16), nullable=False),
        Column("raw_size", BigInteger, nullable=False),
        Column("data", LargeBinary, nullable=False),
    )
    md.create_all(conn)
