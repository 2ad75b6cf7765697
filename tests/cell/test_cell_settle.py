"""The cell reads every engine's counts until they stand still before the collectors' last scrape: a
scrape as the replay ends may come before the engine counted the last request the client saw finish
(the client saw 61 requests finish, the last row said 60, and the cell was INVALID)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from agentsweep.cell.placement import free_port
from agentsweep.cell.plan import CellPlan, plan_cell
from agentsweep.cell.settle import engine_counts, settle_instance_counts
from agentsweep.contract.cell import Cell


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


class _Engine(BaseHTTPRequestHandler):
    replies: ClassVar[list[str]] = []
    served: ClassVar[int] = 0

    def do_GET(self) -> None:
        body = self.replies[min(type(self).served, len(self.replies) - 1)].encode()
        type(self).served += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _plan(tmp_path: Path, server: ThreadingHTTPServer, replies: list[str]) -> CellPlan:
    cell = Cell.parse(
        {
            "config_key": "st", "exp_name": "st-tp1-ep1-u4-off", "runner": "local", "engine": "sim",
            "hardware": "h200", "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "tp": 1,
            "users": 4, "offload": "off", "duration": 6, "traces": "t", "speed": 50,
        }
    )  # fmt: skip
    plan = plan_cell(cell, tmp_path / "cell", port=free_port())
    url = f"http://127.0.0.1:{server.server_port}"
    _Engine.replies, _Engine.served = replies, 0
    return dataclasses.replace(plan, instances=[dataclasses.replace(i, url=url) for i in plan.instances])


@pytest.mark.integration
def test_the_last_scrape_waits_for_the_engine_to_count_the_last_request(
    tmp_path: Path, engine_server: ThreadingHTTPServer
) -> None:
    replies = [vllm_text(60, 1), vllm_text(61, 0), vllm_text(61, 0)]
    plan = _plan(tmp_path, engine_server, replies)
    assert settle_instance_counts(plan, timeout_s=10.0, interval_s=0.01)
    assert _Engine.served == 3  # read until two reads in a row agreed


@pytest.mark.integration
def test_counts_that_keep_moving_are_given_up_on_and_said(
    tmp_path: Path, engine_server: ThreadingHTTPServer
) -> None:
    replies = [vllm_text(n, 1) for n in range(1000)]
    plan = _plan(tmp_path, engine_server, replies)
    assert not settle_instance_counts(plan, timeout_s=0.2, interval_s=0.01)


def test_a_usage_gauge_that_still_moves_does_not_hold_the_last_scrape() -> None:
    assert engine_counts(vllm_text(61, 0)) == engine_counts(vllm_text(61, 0).replace(" 0.0\n", " 0.5\n"))
    assert engine_counts(vllm_text(61, 0)) != engine_counts(vllm_text(60, 0))
    assert engine_counts("<html>not metrics</html>") is None


@pytest.mark.integration
def test_an_engine_that_does_not_answer_does_not_hold_the_cell(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    plan = _plan(tmp_path, server, [vllm_text(1, 0)])
    server.server_close()  # nothing listens there now
    assert settle_instance_counts(plan, timeout_s=5.0, interval_s=0.01)
