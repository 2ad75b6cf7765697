"""The scraper on a disk that fills up: the CSV keeps whole rows and the scraper stops with one line
naming the file (a small tmpfs, filled, as the real thing)."""

from __future__ import annotations

import csv
import io
import threading
from pathlib import Path

import pytest
from agentsweep.errors import WriteError
from agentsweep.metrics.dialects import COLUMNS
from agentsweep.metrics.scraper import Scraper

from tests.support import canned_server, filled_tmpfs

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_scraper_on_a_full_disk_keeps_whole_rows_and_names_the_file(tmp_path):
    text = (FIXTURES / "vllm_recent_dp2_offload.prom").read_text()
    with filled_tmpfs(tmp_path / "small", 1024, 8) as mount:
        out = mount / "server_metrics.csv"
        failed: list[BaseException] = []
        with canned_server() as server:
            server.serve([text])
            url = f"{server.url}/metrics"
            scraper = Scraper(url, out, interval=0.001, log=io.StringIO())

            def scrape(scraper: Scraper = scraper) -> None:
                try:
                    scraper.run()
                except BaseException as err:  # what the thread died of, for the test
                    failed.append(err)

            thread = threading.Thread(target=scrape)
            thread.start()
            thread.join(timeout=60)
            scraper.stop.set()
            thread.join(timeout=5)
        assert len(failed) == 1 and isinstance(failed[0], WriteError), failed
        assert failed[0].render() == f"write error: {out}: cannot write: no space left on device"
        assert failed[0].exit_code == 2
        raw = out.read_bytes()
        assert raw.endswith(b"\r\n")  # no torn row at the end
        with out.open(newline="") as fh:
            rows = list(csv.reader(fh))
        assert rows[0] == list(COLUMNS) and len(rows) > 2
        assert all(len(row) == len(COLUMNS) for row in rows)
