"""The scraper against a real HTTP server on loopback: gaps on failure, SIGTERM, unknown dialect."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from agentsweep.metrics.dialects import COLUMNS
from agentsweep.metrics.scraper import Scraper

from tests.support import CannedServer, canned_server, free_port, wait_until

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent / "fixtures"


@contextmanager
def _serve(replies: list[tuple[int, str]]) -> Iterator[tuple[str, CannedServer]]:
    """The /metrics URL of a canned server answering with ``replies`` in turn (the last repeats)."""
    with canned_server() as server:
        server.serve(replies)
        yield f"{server.url}/metrics", server


@pytest.fixture
def vllm_text() -> str:
    return (FIXTURES / "vllm_recent_dp2_offload.prom").read_text()


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_failed_scrapes_leave_gaps_not_zeros(tmp_path, vllm_text):
    replies = [(200, vllm_text), (500, "engine busy"), (200, "not prometheus {{{"), (200, vllm_text)]
    with _serve(replies) as (url, script):
        out = tmp_path / "server_metrics.csv"
        log = io.StringIO()
        scraper = Scraper(url, out, interval=0.02, log=log)
        thread = threading.Thread(target=scraper.run)
        thread.start()
        wait_until(lambda: script.served >= 6, timeout=10, interval=0.02, what="six scrapes")
        scraper.stop.set()
        thread.join(timeout=5)
    assert scraper.stats.failed == 2
    assert scraper.stats.ok == script.served - 2 or scraper.stats.ok == script.served - 3
    rows = _rows(out)
    assert list(rows[0]) == list(COLUMNS)
    assert len(rows) == scraper.stats.ok
    assert all(r["prefix_cache_queries_total"] == "500000" for r in rows)
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times) and abs(times[0] - time.time()) < 60
    assert "failed (1 in a row, 1 in all): HTTPError" in log.getvalue()
    assert scraper.dialect == "vllm"


def test_appends_to_an_existing_file_without_a_second_header(tmp_path, vllm_text):
    out = tmp_path / "server_metrics.csv"
    with _serve([(200, vllm_text)]) as (url, _):
        for _ in range(2):
            scraper = Scraper(url, out, interval=0.01, log=io.StringIO())
            scraper.stop.set()  # exactly one scrape, then stop
            scraper.run()
    lines = out.read_text().splitlines()
    assert lines[0].startswith("time_s,") and len(lines) == 3
    assert not lines[2].startswith("time_s")


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", "metrics-collector", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_cli_runs_until_sigterm(tmp_path, vllm_text):
    out = tmp_path / "cell" / "server_metrics.csv"
    with _serve([(200, vllm_text)]) as (url, _):
        proc = _cli("--endpoint", url, "--output", str(out), "--interval", "0.05")
        try:
            wait_until(
                lambda: out.exists() and len(out.read_text().splitlines()) >= 4,
                timeout=10,
                interval=0.02,
                what="four lines in server_metrics.csv",
            )
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert "rows written" in err and "Traceback" not in err
    rows = _rows(out)
    assert len(rows) >= 3 and all(r["requests_running"] == "8" for r in rows)


def test_cli_unknown_dialect_exits_2(tmp_path):
    with _serve([(200, "# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n")]) as (url, _):
        proc = _cli("--endpoint", url, "--output", str(tmp_path / "m.csv"), "--interval", "0.05")
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("input error: metrics are neither vLLM") and "Traceback" not in err


def test_cli_bad_endpoint_exits_2(tmp_path):
    proc = _cli("--endpoint", "localhost:8000", "--output", str(tmp_path / "m.csv"))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2 and "not an http(s) URL" in err


def test_unreachable_endpoint_counts_failures(tmp_path):
    port = free_port()  # nobody listens on it
    proc = _cli(
        "--endpoint",
        f"http://127.0.0.1:{port}/metrics",
        "--output",
        str(tmp_path / "m.csv"),
        "--interval",
        "0.05",
        "--max-failures",
        "1000",  # longer than this test: it checks the stop, not the give-up
    )
    time.sleep(0.6)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "0 rows written" in err and "no successful scrape" in err
    assert (tmp_path / "m.csv").read_text().strip() == ",".join(COLUMNS)
