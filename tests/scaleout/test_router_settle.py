"""router.json is read from the router once its counts stop moving: a read while the last request is
routed is torn (smg renders its policy's branch counter before its per-worker counts), which made the
routed cell tests fail under load with 32 routing decisions beside 33 requests sent."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentsweep.cell.plan import CellPlan, plan_cell
from agentsweep.cell.port_allocation import FreePortAllocator
from agentsweep.cell.replicas import write_router_figures
from agentsweep.contract.cell import Cell

from tests.support import CannedServer, canned_server

from .conftest import MODEL

pytestmark = pytest.mark.integration


def smg_text(decisions: int, sent: tuple[int, int], urls: list[str]) -> str:
    """smg's /metrics in its own order: the policy's branch counter, then the per-worker counts."""
    lines = [f'smg_consistent_hashing_policy_branch_total{{branch="routing_key_hit"}} {decisions}']
    lines += [
        f'smg_worker_requests_total{{worker="{url}",model="{MODEL}"}} {n}'
        for url, n in zip(urls, sent, strict=True)
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def router_server() -> Iterator[CannedServer]:
    with canned_server() as server:
        yield server


def _plan(tmp_path: Path, server: CannedServer) -> CellPlan:
    cell = Cell.parse(
        {
            "config_key": "so", "exp_name": "so-tp1-ep1-u4-off-r2-consistent_hash", "runner": "local",
            "engine": "sim", "hardware": "h200", "model": MODEL, "precision": "fp8", "tp": 1, "users": 4, "offload": "off",
            "duration": 6, "traces": "t", "speed": 50, "replicas": 2, "router": "consistent_hash",
            "router_program": "smg",
        }
    )  # fmt: skip
    plan = plan_cell(cell, tmp_path / "cell", ports=FreePortAllocator())
    assert plan.router is not None
    router = dataclasses.replace(plan.router, metrics_url=f"{server.url}/metrics")
    (tmp_path / "cell").mkdir()
    return dataclasses.replace(plan, router=router)


def test_a_read_torn_by_the_last_request_is_not_what_router_json_holds(tmp_path, router_server):
    plan = _plan(tmp_path, router_server)
    urls = [r.url for r in plan.instances]
    # The first read lands while request 33 is routed: its decision not yet rendered, its send rendered.
    router_server.serve([smg_text(32, (17, 16), urls), smg_text(33, (17, 16), urls)])
    write_router_figures(plan, plan.result_dir)
    record = json.loads((plan.result_dir / "router.json").read_text())
    assert record["requests_by_replica"] == [17.0, 16.0]
    assert record["policy_branches"] == {"routing_key_hit": 33.0}
    assert router_server.served == 3  # torn, then the same figures twice


def test_counts_that_keep_moving_are_read_as_last_seen_and_said(tmp_path, router_server):
    from agentsweep.cell.replicas import settled_router_metrics

    plan = _plan(tmp_path, router_server)
    urls = [r.url for r in plan.instances]
    router_server.serve([smg_text(n, (n, 0), urls) for n in range(1, 400)])
    read = settled_router_metrics(plan, timeout_s=0.3, interval_s=0.05)
    assert not read.settled and read.text is not None and read.error is None
    assert router_server.served >= 2


def test_a_router_that_does_not_answer_leaves_the_reason(tmp_path, router_server):
    plan = _plan(tmp_path, router_server)
    assert plan.router is not None
    gone = dataclasses.replace(
        plan, router=dataclasses.replace(plan.router, metrics_url="http://127.0.0.1:1/metrics")
    )
    write_router_figures(gone, plan.result_dir)
    record = json.loads((plan.result_dir / "router.json").read_text())
    assert record["error"].startswith("cannot read http://127.0.0.1:1/metrics: ")
    assert "requests_by_replica" not in record
