"""router_metrics.csv: the router's per-instance request counts scraped over the run, from its real
Prometheus text, with the metrics collector's rules (gaps, not zeros; refuses a foreign file)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentsweep.cli import main

from tests.support import CannedServer, canned_server

SMG_TEXT = """\
# HELP smg_worker_requests_total Requests sent to a worker
# TYPE smg_worker_requests_total counter
smg_worker_requests_total{worker="http://127.0.0.1:9001",route="/v1/chat/completions"} 5
smg_worker_requests_total{worker="http://127.0.0.1:9001",route="/v1/completions"} 2
smg_worker_requests_total{worker="http://127.0.0.1:9002",route="/v1/chat/completions"} 4
"""


@pytest.fixture
def metrics_server() -> Iterator[CannedServer]:
    with canned_server() as server:
        yield server


def _run(server: CannedServer, out: Path, replies: list[tuple[int, str]]) -> int:
    """The collector in this process for 0.4 s, then SIGTERM (as the cell stops it)."""
    server.serve(replies)
    args = [
        "router-metrics-collector", "--endpoint", f"{server.url}/metrics",
        "--program", "smg", "--instance", "r0=http://127.0.0.1:9001", "--instance", "r1=http://127.0.0.1:9002",
        "--output", str(out), "--interval", "0.05",
    ]  # fmt: skip
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    timer = threading.Timer(0.4, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        return main(args)
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])


@pytest.mark.integration
def test_rows_hold_requests_per_instance_and_failed_scrapes_leave_gaps(
    metrics_server, tmp_path: Path
) -> None:
    out = tmp_path / "router_metrics.csv"
    rc = _run(
        metrics_server, out, [(200, SMG_TEXT), (500, "boom"), (200, "<html>proxy</html>"), (200, SMG_TEXT)]
    )
    assert rc == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "time_s,requests.r0,requests.r1"
    rows = [line.split(",")[1:] for line in lines[1:]]
    assert rows and all(row == ["7", "4"] for row in rows)  # the failures wrote nothing, not zeros
    assert len(rows) >= 2


@pytest.mark.integration
def test_a_foreign_file_is_refused_in_one_line(metrics_server, tmp_path: Path, capsys) -> None:
    out = tmp_path / "router_metrics.csv"
    out.write_text("a,b\n1,2\n")
    metrics_server.serve([SMG_TEXT])
    rc = main(["router-metrics-collector", "--endpoint", f"{metrics_server.url}/m",
               "--program", "smg", "--instance", "r0=http://x:1", "--output", str(out)])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"input error: --output {out}: exists and is not a router_metrics.csv "
        "(first line is not the time_s,... header); refusing to append to it"
    ]
    assert out.read_text() == "a,b\n1,2\n"


def test_a_bad_instance_is_a_usage_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["router-metrics-collector", "--endpoint", "http://127.0.0.1:1/m", "--program", "smg",
              "--instance", "r0", "--output", str(tmp_path / "x.csv")])  # fmt: skip
    assert exit_.value.code == 2
    assert "expected NAME=URL" in capsys.readouterr().err
