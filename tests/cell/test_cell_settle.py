"""The cell reads every engine's counts until they stand still before the collectors' last scrape: a
scrape as the replay ends may come before the engine counted the last request the client saw finish
(the client saw 61 requests finish, the last row said 60, and the cell was INVALID)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentsweep.cell.plan import CellPlan, plan_cell
from agentsweep.cell.port_allocation import FreePortAllocator
from agentsweep.cell.settle import engine_counts, settle_instance_counts
from agentsweep.contract.cell import Cell

from tests.support import CannedServer, canned_server


def vllm_text(finished: int, running: int) -> str:
    return (
        "# TYPE vllm:request_success counter\n"
        f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {finished}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="m"} 0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {0.1 * running}\n'
    )


@pytest.fixture
def engine_server() -> Iterator[CannedServer]:
    with canned_server() as server:
        yield server


def _plan(tmp_path: Path, url: str) -> CellPlan:
    cell = Cell.parse(
        {
            "config_key": "st", "exp_name": "st-tp1-ep1-u4-off", "runner": "local", "engine": "sim",
            "hardware": "h200", "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "tp": 1,
            "users": 4, "offload": "off", "duration": 6, "traces": "t", "speed": 50,
        }
    )  # fmt: skip
    plan = plan_cell(cell, tmp_path / "cell", ports=FreePortAllocator())
    return dataclasses.replace(plan, instances=[dataclasses.replace(i, url=url) for i in plan.instances])


@pytest.mark.integration
def test_the_last_scrape_waits_for_the_engine_to_count_the_last_request(
    tmp_path: Path, engine_server: CannedServer
) -> None:
    engine_server.serve([vllm_text(60, 1), vllm_text(61, 0), vllm_text(61, 0)])
    assert settle_instance_counts(_plan(tmp_path, engine_server.url), timeout_s=10.0, interval_s=0.01)
    assert engine_server.served == 3  # read until two reads in a row agreed


@pytest.mark.integration
def test_counts_that_keep_moving_are_given_up_on_and_said(
    tmp_path: Path, engine_server: CannedServer
) -> None:
    engine_server.serve([vllm_text(n, 1) for n in range(1000)])
    assert not settle_instance_counts(_plan(tmp_path, engine_server.url), timeout_s=0.2, interval_s=0.01)


def test_a_usage_gauge_that_still_moves_does_not_hold_the_last_scrape() -> None:
    assert engine_counts(vllm_text(61, 0)) == engine_counts(vllm_text(61, 0).replace(" 0.0\n", " 0.5\n"))
    assert engine_counts(vllm_text(61, 0)) != engine_counts(vllm_text(60, 0))
    assert engine_counts("<html>not metrics</html>") is None


@pytest.mark.integration
def test_an_engine_that_does_not_answer_does_not_hold_the_cell(tmp_path: Path) -> None:
    with canned_server() as server:
        url = server.url
    assert settle_instance_counts(_plan(tmp_path, url), timeout_s=5.0, interval_s=0.01)  # nothing listens
