"""The one reader of server_metrics*.csv: rows in file order, an empty cell a missing figure (never 0),
text named, unreadable rows counted, and a file that is no scrape table refused in one line."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from agentsweep.errors import ResultFileError
from agentsweep.metrics.dialects import COLUMNS, format_row
from agentsweep.metrics.scrapes import ROW_MAX_BYTES, ScrapeReader, read_scrapes


def _csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_the_scrapers_rows_read_back_as_written(tmp_path: Path) -> None:
    written = [
        (100.0, {"kv_cache_usage": 0.25, "prompt_tokens_total": 1000.0, "requests_finished_total": 3.0}),
        (101.0, {"kv_cache_usage": 0.5, "prompt_tokens_total": 2500.0, "requests_finished_total": 7.0}),
    ]
    path = _csv(tmp_path / "server_metrics.csv", list(COLUMNS), [format_row(t, v) for t, v in written])
    scrapes = read_scrapes(path)
    assert [s.time_s for s in scrapes] == [100.0, 101.0]
    for scrape, (_, values) in zip(scrapes, written, strict=True):
        assert {k: v for k, v in scrape.values.items() if v is not None} == values
        assert scrape.values["cpu_cache_hits_total"] is None  # not reported: empty, never 0
        assert scrape.not_number is None


def test_unreadable_rows_are_counted_and_text_is_named(tmp_path: Path) -> None:
    header = ["time_s", "kv_cache_usage", "prompt_tokens_total"]
    path = _csv(
        tmp_path / "server_metrics.r1.csv",
        header,
        [
            ["1.0", "0.5", "10"],
            ["soon", "0.5", "10"],
            ["2.0", "0.5"],
            ["3.0", "lots", "nan"],
            ["4.0", "", "40"],
        ],
    )
    reader = ScrapeReader(path)
    scrapes = list(reader)
    assert [s.time_s for s in scrapes] == [1.0, 3.0, 4.0]
    assert reader.bad_rows == 2 and reader.header == tuple(header)
    assert "requests_running" in reader.missing and "kv_cache_usage" not in reader.missing
    assert scrapes[1].not_number == ("kv_cache_usage", "lots")
    assert scrapes[1].values["prompt_tokens_total"] is None  # nan is no figure either
    assert scrapes[2].values["kv_cache_usage"] is None and scrapes[2].values["prompt_tokens_total"] == 40.0


def test_a_row_past_the_limit_is_skipped_without_holding_it(tmp_path: Path) -> None:
    path = tmp_path / "server_metrics.csv"
    path.write_text("time_s,kv_cache_usage\n1.0,0.5\n" + "9" * (3 * ROW_MAX_BYTES) + "\n2.0,0.6\n")
    reader = ScrapeReader(path)
    assert [s.time_s for s in reader] == [1.0, 2.0] and reader.bad_rows == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "server_metrics.csv missing"),
        (lambda p: p.write_text(""), "server_metrics.csv: no time_s column"),
        (lambda p: p.write_text("when,kv_cache_usage\n1,0.5\n"), "server_metrics.csv: no time_s column"),
        (lambda p: os.mkfifo(p), "server_metrics.csv: not a regular file (a FIFO)"),
        (lambda p: p.mkdir(), "server_metrics.csv: not a regular file (a directory)"),
    ],
)
def test_a_file_that_is_no_scrape_table_is_refused_in_one_line(tmp_path: Path, make, message: str) -> None:
    path = tmp_path / "server_metrics.csv"
    make(path)
    with pytest.raises(ResultFileError) as err:
        read_scrapes(path)
    assert str(err.value) == message


def test_the_routers_scrapes_read_with_their_own_columns(tmp_path: Path) -> None:
    path = _csv(
        tmp_path / "router_metrics.csv", ["time_s", "requests.r0", "requests.r1"], [["1.0", "3", "2"]]
    )
    reader = ScrapeReader(path, figures=None)
    (scrape,) = list(reader)
    assert reader.figures == ("requests.r0", "requests.r1") and reader.missing == ()
    assert scrape.values == {"requests.r0": 3.0, "requests.r1": 2.0}
