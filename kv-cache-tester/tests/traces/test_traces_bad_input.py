"""Damaged trace files found by a bad-input sweep of `kv-cache-tester analyze`: one line, exit 2.

A truncated .gz ended in a traceback (EOFError is not an OSError); NaN in a trace said only
"unreadable"; an integral float like 1e308 was taken as a token count.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from kv_cache_tester.cli import main


def _trace(requests: list[dict], **over: object) -> dict:
    return {"id": "t1", "block_size": 64, "hash_id_scope": "local", "requests": requests, **over}


def _req(**over: object) -> dict:
    return {"t": 0.0, "type": "n", "in": 100, "out": 5, "hash_ids": [1], **over}


def _run(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    rc = main(["analyze", str(path)])
    return rc, capsys.readouterr().err


def test_truncated_gzip_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = gzip.compress(json.dumps(_trace([_req() for _ in range(200)])).encode())
    path = tmp_path / "t.json.gz"
    path.write_bytes(data[: len(data) // 2])
    assert _run(capsys, path) == (2, f"trace error: {path}: cannot read: truncated compressed file\n")


def test_truncated_gzip_jsonl_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = b"".join(json.dumps(_trace([_req()], id=f"t{i}")).encode() + b"\n" for i in range(3000))
    data = gzip.compress(rows, compresslevel=1)
    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(data[: len(data) * 3 // 4])
    rc, err = _run(capsys, path)
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(f"trace error: {path}: line ") and err.endswith(
        ": cannot read: truncated compressed file\n"
    )
    assert int(err.split(": line ")[1].split(":")[0]) > 1  # the lines before the damage were read


def test_corrupt_gzip_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray(gzip.compress(json.dumps(_trace([_req()])).encode()))
    data[20:30] = b"\xff" * 10  # damage the deflate stream after the header
    path = tmp_path / "t.json.gz"
    path.write_bytes(bytes(data))
    rc, err = _run(capsys, path)
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(f"trace error: {path}: cannot read: ")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_in_a_trace_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], constant: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_trace([_req()])).replace('"t": 0.0', f'"t": {constant}'))
    assert _run(capsys, path) == (
        2,
        f"trace error: {path}: bad JSON at line 1 column 1: {constant} is not valid JSON (write a number or null)\n",
    )


def test_absurd_token_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_trace([_req(), _req(out=1e308)])))
    rc, err = _run(capsys, path)
    assert rc == 2
    assert err.startswith(f"trace error: {path}: request 1: out: must be at most 2147483647 tokens, got 1000")
