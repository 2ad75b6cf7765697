"""The theoretical hit rate against the simulated engine's cache, with failing requests (scripts/fidelity.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_with_ten_percent_of_requests_failing_the_server_caches_what_the_reference_says(repo_root):
    # the simulated engine, a cache that evicts nothing, 10 % of requests answered 500 before any work
    cmd = [
        sys.executable, str(repo_root / "scripts" / "fidelity.py"), "sim", "--fail-rate", "0.1",
        "--duration", "900", "--users", "6", "--speed", "40", "--json",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    row = json.loads(res.stdout.strip().splitlines()[-1])
    assert row["failed"] >= 10 and row["accepted"] == row["requests"] - row["failed"]
    assert abs(row["cached"] - row["theoretical"]) < 0.005
    assert row["server_prompt"] == row["client_prompt"] and row["server_cached"] == row["client_cached"]
