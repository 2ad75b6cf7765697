"""Malformed traces: one exact error line and exit status 2 through `kv-cache-tester analyze`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kv_cache_tester.cli import main


def _req(**over: object) -> dict:
    base = {"t": 0.0, "type": "n", "in": 100, "out": 5, "hash_ids": [1], "think_time": 0.0}
    base.update(over)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def _trace(requests: list, **over: object) -> dict:
    doc = {"id": "t1", "block_size": 64, "hash_id_scope": "local", "requests": requests}
    doc.update(over)
    return doc


def _sub(requests: list) -> dict:
    return {"t": 1.0, "type": "subagent", "agent_id": "agent_001", "requests": requests}


CASES = [
    ("missing_in", _trace([_req(), _req(**{"in": _DROP})]), "request 1: in: missing"),
    ("negative_out", _trace([_req(out=-3)]), "request 0: out: must be a non-negative integer, got -3"),
    ("string_in", _trace([_req(**{"in": "abc"})]), "request 0: in: must be an integer, got 'abc'"),
    (
        "zero_in",
        _trace([_req(**{"in": 0, "hash_ids": []})]),
        "request 0: in: must be a positive integer, got 0",
    ),
    (
        "too_many_ids",
        _trace([_req(hash_ids=[1, 2, 3, 4, 5])]),
        "request 0: hash_ids: 5 ids for 100 tokens (at most 2 blocks of 64)",
    ),
    (
        "negative_id",
        _trace([_req(**{"in": 200, "hash_ids": [1, -1]})]),
        "request 0: hash_ids: item 1 must be an integer from 0 to 2**63-1, got -1",
    ),
    (
        "ids_not_list",
        _trace([_req(hash_ids="1,2")]),
        "request 0: hash_ids: must be a list of integers, got '1,2'",
    ),
    ("missing_t", _trace([_req(t=_DROP)]), "request 0: t: missing"),
    ("negative_think", _trace([_req(think_time=-1.5)]), "request 0: think_time: must be >= 0, got -1.5"),
    ("subagent_request", _trace([_req(), _sub([_req(out=_DROP)])]), "request 1.0: out: missing"),
    (
        "nested_subagent",
        _trace([_req(), _sub([_sub([_req()])])]),
        "request 1.0: type: nested sub-agents are not supported",
    ),
    (
        "unknown_scope",
        _trace([_req()], hash_id_scope="galaxy"),
        "hash_id_scope: unknown scope 'galaxy' (expected local or global)",
    ),
    ("empty_trace", _trace([]), "requests: empty trace"),
    ("no_requests", {"id": "t1", "block_size": 64}, "requests: missing"),
    (
        "bad_block_size",
        _trace([_req()], block_size=0),
        "block_size: must be an integer from 1 to 2147483647, got 0",
    ),
    ("request_not_object", _trace([_req(), 7]), "request 1: must be an object, got 7"),
]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("name", "doc", "message"), CASES, ids=[c[0] for c in CASES])
def test_malformed_trace_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, doc: dict, message: str
) -> None:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    rc, err = _run(["analyze", str(path)], capsys)
    assert rc == 2
    assert err == f"trace error: {path}: {message}\n"


def test_bad_json_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"id": "x",\n "requests": [}\n')
    rc, err = _run(["analyze", str(path)], capsys)
    assert rc == 2
    assert err == f"trace error: {path}: bad JSON at line 2 column 15: Expecting value\n"


def test_bad_jsonl_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_trace([_req()])) + "\n" + "{oops\n")
    rc, err = _run(["analyze", str(path)], capsys)
    assert rc == 2
    assert (
        err
        == f"trace error: {path}: line 2: bad JSON at column 2: Expecting property name enclosed in double quotes\n"
    )


def test_jsonl_row_error_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rows.jsonl"
    rows = [_trace([_req()]), _trace([_req(), _req(out=-1)], id="t2")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, err = _run(["analyze", str(path)], capsys)
    assert rc == 2
    assert err == f"trace error: {path}:2: request 1: out: must be a non-negative integer, got -1\n"


def test_mooncake_row_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mooncake.jsonl"
    path.write_text(
        json.dumps({"timestamp": 0, "input_length": 10, "output_length": -2, "hash_ids": []}) + "\n"
    )
    rc, err = _run(["analyze", str(path)], capsys)
    assert rc == 2
    assert err == f"trace error: {path}:1: request 0: output_length: must be a non-negative integer, got -2\n"


def test_missing_path_and_empty_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _run(["analyze", str(tmp_path / "nope")], capsys)
    assert (rc, err) == (2, f"trace error: {tmp_path / 'nope'}: no such file or directory\n")
    rc, err = _run(["analyze", str(tmp_path)], capsys)
    assert (rc, err) == (2, f"trace error: {tmp_path}: no .json or .jsonl trace files in this directory\n")


def test_bad_file_in_a_directory_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_trace([_req()])))
    (tmp_path / "b.json").write_text(json.dumps(_trace([_req(hash_ids=[1, 2, 3])], id="b")))
    rc, err = _run(["analyze", str(tmp_path)], capsys)
    assert rc == 2
    assert (
        err
        == f"trace error: {tmp_path / 'b.json'}: request 0: hash_ids: 3 ids for 100 tokens (at most 2 blocks of 64)\n"
    )


def test_usage_errors(tmp_path: Path, sample_traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _run(["analyze", str(sample_traces / "trace_0504.json"), "--second-tier-blocks", "5"], capsys)
    assert (rc, err) == (2, "usage error: --second-tier-blocks needs --cache-blocks\n")
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(sample_traces), "--cache-blocks", "-4"])
    assert exc.value.code == 2
    assert "--cache-blocks: must be >= 0, got -4" in capsys.readouterr().err


@pytest.mark.integration
def test_cli_subprocess_exit_status(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_trace([_req(**{"in": -5})])))
    proc = subprocess.run(
        [sys.executable, "-m", "kv_cache_tester.cli", "analyze", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr == f"trace error: {path}: request 0: in: must be a positive integer, got -5\n"
    assert "Traceback" not in proc.stderr
