"""The collector gives up on a dead, refusing, hanging or non-metrics endpoint instead of scraping
forever: one line (exit 2 when nothing ever succeeded, 1 when the target went away part way), and
that line is the last of its output, where the cell's failure reason quotes it from."""

from __future__ import annotations

import csv
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from agentsweep.metrics.dialects import COLUMNS

from tests.support import free_port, poll_until

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent / "fixtures"


def collector(*args: str, timeout: float = 10) -> tuple[int, str]:
    """The real `agentsweep metrics-collector`; running past `timeout` (scraping forever) fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "metrics-collector", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stderr


def one_line(err: str) -> str:
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert len(err) - 1 <= 300, err
    return err[:-1]


@contextmanager
def serve(handle: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            with suppress(BrokenPipeError, ConnectionResetError):  # the client gave up on the reply
                handle(self)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def reply(
    status: int, body: str, content_type: str = "text/plain"
) -> Callable[[BaseHTTPRequestHandler], None]:
    def handle(h: BaseHTTPRequestHandler) -> None:
        data = body.encode()
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return handle


def test_refusing_endpoint_with_the_default_limit(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    out = tmp_path / "server_metrics.csv"
    start = time.monotonic()
    rc, err = collector("--endpoint", url, "--output", str(out), "--interval", "0.2")
    assert time.monotonic() - start < 10
    assert (rc, one_line(err)) == (
        2,
        f"input error: {url}: gave up after 10 failed scrapes in a row, none succeeded "
        "(last error: URLError: <urlopen error [Errno 111] Connection refused>)",
    )
    assert out.read_text() == ",".join(COLUMNS) + "\n"  # the header, no rows of zeros


@pytest.mark.parametrize(
    ("handler", "last_error"),
    [
        (reply(200, "<html><body>Welcome to nginx!</body></html>\n" * 50, "text/html"), "ValueError: "),
        (reply(404, "not found"), "HTTPError: HTTP Error 404: Not Found"),
        (reply(503, "loading"), "HTTPError: HTTP Error 503: Service Unavailable"),
    ],
    ids=["html page", "404", "503"],
)
def test_non_metrics_endpoint(tmp_path: Path, handler, last_error: str) -> None:
    with serve(handler) as url:
        rc, err = collector("--endpoint", url, "--output", str(tmp_path / "m.csv"), "--interval", "0.05")
    line = one_line(err)
    assert rc == 2
    assert line.startswith(f"input error: {url}: gave up after 10 failed scrapes in a row, none succeeded")
    assert f"(last error: {last_error}" in line


def test_endpoint_that_never_answers(tmp_path: Path) -> None:
    """Accepts the connection, then says nothing: each scrape times out."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
        rc, err = collector(
            "--endpoint", url, "--output", str(tmp_path / "m.csv"),
            "--interval", "0.05", "--timeout", "0.2", "--max-failures", "3",
        )  # fmt: skip
    assert (rc, one_line(err)) == (
        2,
        f"input error: {url}: gave up after 3 failed scrapes in a row, none succeeded "
        "(last error: TimeoutError: timed out)",
    )


def test_reply_that_trickles_forever(tmp_path: Path) -> None:
    """Headers, then a byte now and then: no single read times out, the whole reply does."""

    def trickle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", "1000000")
        h.end_headers()
        for _ in range(200):
            h.wfile.write(b"#")
            h.wfile.flush()
            time.sleep(0.02)

    with serve(trickle) as url:
        rc, err = collector(
            "--endpoint", url, "--output", str(tmp_path / "m.csv"),
            "--interval", "0.05", "--timeout", "0.3", "--max-failures", "2",
        )  # fmt: skip
    assert (rc, one_line(err)) == (
        2,
        f"input error: {url}: gave up after 2 failed scrapes in a row, none succeeded "
        "(last error: TimeoutError: reply not complete within 0.3 s)",
    )


def test_endless_reply(tmp_path: Path) -> None:
    def endless(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.end_headers()  # no length: the body ends when the connection does, which it never does
        block = b"# filler\n" * 10_000
        while True:
            h.wfile.write(block)

    with serve(endless) as url:
        rc, err = collector(
            "--endpoint", url, "--output", str(tmp_path / "m.csv"),
            "--interval", "0.05", "--timeout", "5", "--max-failures", "2",
        )  # fmt: skip
    assert (rc, one_line(err)) == (
        2,
        f"input error: {url}: gave up after 2 failed scrapes in a row, none succeeded "
        "(last error: ValueError: reply larger than 32 MiB)",
    )


def test_target_gone_part_way_keeps_the_rows(tmp_path: Path) -> None:
    good = (FIXTURES / "vllm_recent_dp2_offload.prom").read_text()
    served = {"n": 0}
    lock = threading.Lock()

    def flaky(h: BaseHTTPRequestHandler) -> None:
        with lock:
            served["n"] += 1
            n = served["n"]
        (reply(200, good) if n <= 3 else reply(500, "engine died"))(h)

    out = tmp_path / "server_metrics.csv"
    with serve(flaky) as url:
        rc, err = collector(
            "--endpoint", url, "--output", str(out), "--interval", "0.05", "--max-failures", "4"
        )
    lines = err.splitlines()
    assert rc == 1 and "Traceback" not in err
    assert lines[-1] == (
        f"run error: {url}: gave up after 4 failed scrapes in a row (3 rows written before; "
        "last error: HTTPError: HTTP Error 500: Internal Server Error)"
    )
    assert len(lines[-1]) <= 300
    assert any("failed (1 in a row, 1 in all)" in line for line in lines[:-1])
    with out.open(newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 3


def test_a_streak_shorter_than_the_limit_is_survived(tmp_path: Path) -> None:
    good = (FIXTURES / "vllm_recent_dp2_offload.prom").read_text()
    served = {"n": 0}
    lock = threading.Lock()

    def blip(h: BaseHTTPRequestHandler) -> None:
        with lock:
            served["n"] += 1
            n = served["n"]
        (reply(503, "busy") if 2 <= n <= 4 else reply(200, good))(h)

    out = tmp_path / "server_metrics.csv"
    with serve(blip) as url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentsweep.cli", "metrics-collector", "--endpoint", url,
             "--output", str(out), "--interval", "0.05", "--max-failures", "4"],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            poll_until(lambda: served["n"] >= 8, timeout=10, interval=0.02)
            proc.terminate()
            _, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert "3 scrapes failed" in err


@pytest.mark.parametrize("value", ["0", "-1", "x", "1000001"])
def test_max_failures_must_be_a_sane_count(tmp_path: Path, value: str) -> None:
    rc, err = collector("--endpoint", "http://127.0.0.1:9/metrics", "--output", str(tmp_path / "m.csv"),
                        "--max-failures", value)  # fmt: skip
    assert rc == 2 and "argument --max-failures" in one_line(err)
