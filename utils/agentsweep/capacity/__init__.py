"""Capacity under SLO: how many agents a GPU serves while every tier's service level holds.

- ``search``: which user count to measure next, and each tier's boundary from the steps (isotonic
  smoothing, bootstrap interval, cliffs); ``isotonic`` the smoothing itself.
- ``measure``: a run's SLO statistics (through ``kv_cache_tester.metrics``), throughput and KV figures.
- ``run``: the capacity cell (one engine start, steps in ``steps/<n>/``, capacity.json).
- ``steps``: a step's cell and record, and which steps an interrupted search's ``--resume`` keeps.
- ``engine_state``: idle wait and prefix-cache reset between steps.
- ``grid``: the capacity read off an ordinary sweep's cells (interpolated).
- ``lines``: the one plain line per tier; ``power``: the agents-per-MW hook.

The tiers and the search options are contracts (``agentsweep.contract.slo``), capacity.json is
owned by ``agentsweep.contract.resultdir.capacity``; docs/capacity.md.
"""
