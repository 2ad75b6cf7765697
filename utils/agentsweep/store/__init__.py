"""The results store: every ingested cell result, across runs, in one database (ARCHITECTURE §8).

A SQLite file by default (``results/agentsweep.db``), PostgreSQL by URL. ``db`` opens it and keeps
its schema current (``migrations/``), ``ingest`` adds result directories (idempotent by receipt),
``query`` answers curves, history and diffs; ``result_files`` is the one place that reads a result
directory's files.
"""
