"""The one reader and writer of requests.jsonl and summary.json: streamed, bounded, never fatal on a bad
line, and naming the file and the field of whatever breaks the contract."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_cache_tester.replay import (
    RECORD_LINE_MAX_BYTES,
    RecordReader,
    RequestRecord,
    ResultError,
    accepted,
    load_summary,
    read_records,
    write_records,
    write_summary,
)


def _record(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "trace_id": "t0",
        "session_id": "t0",
        "user": 0,
        "turn": 0,
        "phase": "profile",
        "request_id": None,
        "t_dispatch": 0.5,
        "t_done": 1.5,
        "ttft_s": 0.1,
        "e2e_s": 1.0,
        "itl_s": {"mean": 0.01, "p50": 0.01, "p99": 0.02, "max": 0.03, "n": 9},
        "tpot_s": 0.01,
        "prompt_tokens": 100,
        "prompt_tokens_source": "server",
        "cached_tokens": 40,
        "expected_prompt_tokens": 100,
        "output_tokens": 10,
        "expected_output_tokens": 10,
        "theoretical_hit_blocks": 1,
        "total_blocks": 2,
        "status": "ok",
        "error": None,
    }
    base.update(changes)
    return base


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_records_round_trip_through_the_writer_and_the_reader(tmp_path: Path) -> None:
    records: list[RequestRecord] = [_record(turn=i) for i in range(3)]  # type: ignore[misc]
    path = tmp_path / "requests.jsonl"
    assert write_records(path, records) == 3
    reader = RecordReader(path, required=RequestRecord.__required_keys__)
    assert list(reader) == records
    assert (reader.records, reader.bad_lines, reader.dropped_values) == (3, 0, 0)


def test_a_bad_line_is_counted_never_fatal(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "requests.jsonl",
        [
            json.dumps(_record()),
            "not json",
            "[1, 2]",
            json.dumps({"t_dispatch": 1.0}),  # no trace_id
            json.dumps(_record(t_dispatch="soon")),  # a required value of the wrong type
            "",
            json.dumps(_record(turn=5)),
        ],
    )
    reader = RecordReader(path)
    assert [n for n, _ in reader.numbered()] == [1, 7]
    assert (reader.records, reader.bad_lines, reader.first_bad_line) == (2, 4, 2)
    assert reader.first_bad.startswith("line 2: bad JSON")
    # Reading again starts the counts afresh.
    assert len(list(reader)) == 2 and reader.bad_lines == 4


def test_a_value_of_the_wrong_type_reads_as_absent_and_is_counted(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "requests.jsonl",
        [json.dumps(_record(ttft_s="fast", error="ReadTimeout: timed out", itl_s={"n": 1.5}))],
    )
    reader = RecordReader(path)
    (rec,) = list(reader)
    assert "ttft_s" not in rec and "error" not in rec and "itl_s" not in rec
    assert rec.get("ttft_s") is None and rec["e2e_s"] == 1.0
    assert reader.dropped_values == 3 and reader.bad_lines == 0
    assert reader.first_dropped == "requests.jsonl: line 1: ttft_s: must be a number or null, got 'fast'"


def test_strict_reading_names_the_line_and_the_field_but_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(_record()) + "\n" + '{"trace_id": "t0", "t_disp')
    reader = RecordReader(path, strict=True)
    assert len(list(reader)) == 1 and reader.torn_tail and reader.bad_lines == 1
    _write(path, [json.dumps(_record(status="fine")), json.dumps(_record())])
    with pytest.raises(ResultError) as err:
        list(RecordReader(path, strict=True))
    assert str(err.value) == "requests.jsonl: line 1: status: must be one of 'ok', 'error', got 'fine'"
    _write(path, [json.dumps(_record()), "{not json", json.dumps(_record())])
    with pytest.raises(ResultError, match=r"^requests.jsonl: line 2: bad JSON"):
        list(RecordReader(path, strict=True))


def test_a_line_past_the_limit_is_skipped_without_holding_it(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    with path.open("w") as fh:
        fh.write(json.dumps(_record()) + "\n")
        fh.write('{"trace_id": "' + "x" * (3 * RECORD_LINE_MAX_BYTES) + '"}\n')
        fh.write(json.dumps(_record(turn=2)) + "\n")
    reader = RecordReader(path)
    assert [r["turn"] for r in reader] == [0, 2]
    assert reader.bad_lines == 1 and reader.first_bad == "line 2: longer than 1 MiB"


def _reference_lines(data: bytes, limit: int) -> list[tuple[bytes | None, bool]]:
    """What the reader's line splitter must give: every line, None for one past the limit."""
    pieces = data.split(b"\n")
    last = pieces.pop()
    out: list[tuple[bytes | None, bool]] = [(p if len(p) <= limit else None, True) for p in pieces]
    if last:
        out.append((last if len(last) <= limit else None, len(last) > limit))
    return out


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    ended=st.booleans(),
    chunk=st.integers(min_value=1, max_value=64),
    limit=st.integers(min_value=0, max_value=30),
)
def test_lines_split_across_read_chunks_as_if_read_one_by_one(
    lines: list[bytes], ended: bool, chunk: int, limit: int
) -> None:
    """Lines that straddle a read, over-long lines that span several reads, a last line cut short."""
    import io

    from kv_cache_tester.replay import results

    data = b"\n".join(lines) + (b"\n" if ended and lines else b"")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(results, "READ_CHUNK_BYTES", chunk)
        mp.setattr(results, "RECORD_LINE_MAX_BYTES", limit)
        got = list(results._lines(io.BytesIO(data)))
    assert got == _reference_lines(data, limit)


def test_blank_lines_are_no_records_and_no_bad_lines(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "requests.jsonl", ["", json.dumps(_record()), "  ", "\r", json.dumps(_record(turn=1))]
    )
    reader = RecordReader(path)
    assert [(n, r["turn"]) for n, r in reader.numbered()] == [(2, 0), (5, 1)]
    assert reader.bad_lines == 0 and not reader.torn_tail


def test_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    os.mkfifo(path)
    with pytest.raises(ResultError, match=r"^requests.jsonl: not a regular file \(a FIFO\)$"):
        read_records(path)


def test_accepted_falls_back_to_ok_for_older_writers() -> None:
    assert accepted(_record(status="error", accepted=True))  # type: ignore[arg-type]
    assert not accepted(_record(accepted=False))  # type: ignore[arg-type]
    assert accepted(_record())  # type: ignore[arg-type]
    assert not accepted(_record(status="error"))  # type: ignore[arg-type]


def _summary() -> dict[str, Any]:
    dist = {"mean": 1.0, "p50": 1.0, "p90": 2.0, "p95": 2.0, "p99": 3.0, "p99.9": None}
    return {
        "schema_version": 1,
        "counts": {"sent": 3, "ok": 2, "failed": 1, "failed_by_class": {"http_500": 1}, "warmup": 0},
        "window": {"start_unix": 100.0, "end_unix": 160.0, "duration_s": 60.0},
        "throughput": {
            "requests_per_s": 0.1,
            "input_tok_per_s": 5,
            "output_tok_per_s": 1.0,
            "total_tok_per_s": 6,
        },
        "latency": {k: dict(dist) for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "interactivity_tok_per_s")},
    }


def test_a_summary_round_trips_and_a_broken_one_names_what_broke(tmp_path: Path) -> None:
    write_summary(tmp_path, _summary())  # type: ignore[arg-type]
    assert load_summary(tmp_path) == _summary()
    with pytest.raises(ResultError, match=r"^summary\.json missing$"):
        load_summary(tmp_path / "nowhere")
    (tmp_path / "summary.json").write_text("{")
    with pytest.raises(ResultError, match=r"^summary.json: not JSON"):
        load_summary(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"schema_version": 1, "counts": {"sent": 1}}))
    with pytest.raises(ResultError, match=r"^summary\.json: window: missing$"):
        load_summary(tmp_path)
    assert load_summary(tmp_path, required=("counts",))["counts"] == {"sent": 1}
    (tmp_path / "summary.json").unlink()
    (tmp_path / "summary.json").symlink_to("/dev/zero")  # a link is refused, never read through
    with pytest.raises(ResultError, match=r"^summary.json: a symbolic link \(to '/dev/zero'\)"):
        load_summary(tmp_path)
    (tmp_path / "summary.json").unlink()
    os.mkfifo(tmp_path / "summary.json")  # nor does a FIFO block the reader
    with pytest.raises(ResultError, match=r"^summary.json: not a regular file \(a FIFO\)$"):
        load_summary(tmp_path)
