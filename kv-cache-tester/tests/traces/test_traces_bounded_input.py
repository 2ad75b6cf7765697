"""Hostile trace inputs: one line of at most 300 characters and exit status 2, within 10 seconds.

Before the bounds 5,000-deep JSON ended in a RecursionError traceback, a FIFO blocked forever (given
directly) or vanished from the dataset (inside a directory), a dangling link was skipped silently,
and UTF-16 or BOM-prefixed files were "unreadable" without saying why.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kv_cache_tester.cli import main
from kv_cache_tester.traces import loaders


def _trace(requests: list[dict] | None = None, **over: object) -> dict:
    reqs = requests or [{"t": 0.0, "type": "n", "in": 100, "out": 5, "hash_ids": [1]}]
    return {"id": "t1", "block_size": 64, "hash_id_scope": "local", "requests": reqs, **over}


def _req(**over: object) -> dict:
    return {"t": 0.0, "type": "n", "in": 100, "out": 5, "hash_ids": [1], **over}


def analyze(path: Path | str, cwd: Path, *extra: str) -> tuple[int, str, str]:
    """The real `kv-cache-tester analyze` in a child process: a hang fails the test instead of the run."""
    proc = subprocess.run(
        [sys.executable, "-m", "kv_cache_tester.cli", "analyze", str(path), "--no-plot", *extra],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


def one_line(err: str) -> str:
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err[:2000]
    assert len(err) - 1 <= 300, err[:2000]
    return err[:-1]


def _write(path: Path, data: bytes | str | dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, dict):
        data = json.dumps(data)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


TEXT = json.dumps(_trace())
HOSTILE: dict[str, tuple[str, bytes | str | dict, str]] = {
    "5,000-deep JSON": (
        "t.json",
        "[" * 5000 + "]" * 5000,
        "t.json: bad JSON at line 1 column 1: nested too deeply",
    ),
    "5,000-deep JSONL line": (
        "t.jsonl",
        TEXT + "\n" + "[" * 5000 + "]" * 5000 + "\n",
        "t.jsonl: line 2: bad JSON at column 1: nested too deeply for the JSON parser",
    ),
    "UTF-16 with BOM": (
        "t.json",
        TEXT.encode("utf-16"),
        "t.json: the file is UTF-16-LE (with a byte order mark) text",
    ),
    "UTF-16-LE JSONL": (
        "t.jsonl",
        (TEXT + "\n").encode("utf-16-le"),
        "t.jsonl: the file is UTF-16-LE text; traces",
    ),
    "UTF-16-BE": (
        "t.json",
        TEXT.encode("utf-16-be"),
        "t.json: the file is UTF-16-BE text; traces must be UTF-8",
    ),
    "UTF-32 with BOM": (
        "t.json",
        TEXT.encode("utf-32"),
        "t.json: the file is UTF-32-LE (with a byte order mark)",
    ),
    "Latin-1": (
        "t.json",
        json.dumps(_trace(), ensure_ascii=False).replace('"t1"', '"caf\xe9"').encode("latin-1"),
        "t.json: bad JSON at line 1 column 12: not UTF-8 text (invalid continuation byte, byte 0xe9)",
    ),
    "tool_tokens 10**20": (
        "t.json",
        _trace(tool_tokens=10**20),
        "t.json: tool_tokens: must be an integer from 0",
    ),
    "block_size 2**40": (
        "t.json",
        _trace(block_size=2**40),
        "t.json: block_size: must be an integer from 1 to",
    ),
    "hash id 2**64": (
        "t.json",
        _trace([_req(hash_ids=[2**64])]),
        "request 0: hash_ids: item 0 must be an integer",
    ),
    "t 1e300": ("t.json", _trace([_req(t=1e300)]), "t.json: request 0: t: must be at most 1e+09, got 1e+300"),
    "think_time 1e12": (
        "t.json",
        _trace([_req(think_time=1e12)]),
        "request 0: think_time: must be at most 1e+09",
    ),
    "mooncake timestamp 1e20": (
        "m.jsonl",
        json.dumps({"timestamp": 1e20, "input_length": 10, "output_length": 1, "hash_ids": [0]}) + "\n",
        "m.jsonl:1: request 0: timestamp: must be at most 1e+12, got 1e+20",
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_trace_is_one_short_line(tmp_path: Path, case: str) -> None:
    name, content, expected = HOSTILE[case]
    _write(tmp_path / "d" / name, content)
    for source in ("d", f"d/{name}"):  # through the directory and named directly
        rc, out, err = analyze(source, tmp_path)
        line = one_line(err)
        assert (rc, out) == (2, "")
        assert line.startswith(f"trace error: d/{name}") and expected in line, line


@pytest.mark.integration
def test_fifo_given_directly_or_in_a_directory(tmp_path: Path) -> None:
    _write(tmp_path / "d" / "a.json", _trace())
    os.mkfifo(tmp_path / "d" / "b.json")
    for source in ("d", "d/b.json"):
        rc, _, err = analyze(source, tmp_path)
        assert (rc, one_line(err)) == (2, "trace error: d/b.json: not a regular file (a FIFO)")


@pytest.mark.integration
def test_link_to_a_fifo_inside_the_directory(tmp_path: Path) -> None:
    _write(tmp_path / "d" / "a.json", _trace())
    os.mkfifo(tmp_path / "d" / "pipe")
    (tmp_path / "d" / "b.jsonl").symlink_to("pipe")
    rc, _, err = analyze("d", tmp_path)
    assert (rc, one_line(err)) == (2, "trace error: d/b.jsonl: not a regular file (a FIFO)")


@pytest.mark.integration
def test_dangling_link_is_an_error(tmp_path: Path) -> None:
    _write(tmp_path / "d" / "a.json", _trace())
    (tmp_path / "d" / "gone.json").symlink_to("../nowhere.json")
    for source in ("d", "d/gone.json"):
        rc, _, err = analyze(source, tmp_path)
        assert (rc, one_line(err)) == (
            2,
            "trace error: d/gone.json: broken symbolic link (to '../nowhere.json')",
        )


@pytest.mark.integration
def test_links_are_followed_only_inside_the_directory(tmp_path: Path) -> None:
    _write(tmp_path / "d" / "sub" / "a.json", _trace(id="a"))
    (tmp_path / "d" / "inside.json").symlink_to("sub/a.json")  # followed: a second copy of "a"
    _write(tmp_path / "outside" / "secret.json", _trace(id="secret"))
    (tmp_path / "d" / "out.json").symlink_to("../outside/secret.json")
    (tmp_path / "d" / "dev.json").symlink_to("/dev/zero")
    (tmp_path / "d" / "tree").symlink_to("../outside")
    rc, out, err = analyze("d", tmp_path, "--output-dir", "stats")
    assert (rc, err) == (0, "")
    skipped = ["dev.json (leads outside d)", "out.json (leads outside d)", "tree (a link to a directory)"]
    assert (
        "skipped 3 symbolic links (followed only to files inside the directory given): " + ", ".join(skipped)
    ) in out.splitlines()
    report = json.loads((tmp_path / "stats" / "trace_stats.json").read_text())["load_report"]
    assert report["skipped_links"] == skipped
    assert report["traces_in"] == 2 and report["renamed_duplicates"] == {"a~2": "a"}


@pytest.mark.integration
def test_only_links_leading_outside_is_an_error_that_says_so(tmp_path: Path) -> None:
    _write(tmp_path / "outside" / "a.json", _trace())
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.json").symlink_to("../outside/a.json")
    rc, _, err = analyze("d", tmp_path)
    assert (rc, one_line(err)) == (
        2,
        "trace error: d: no .json or .jsonl trace files in this directory "
        "(skipped 1 symbolic links: a.json (leads outside d))",
    )


@pytest.mark.integration
def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    _write(tmp_path / "d" / "a.json", bom + json.dumps(_trace(id="a")).encode())
    _write(tmp_path / "d" / "b.jsonl", bom + json.dumps(_trace(id="b")).encode() + b"\n")
    _write(tmp_path / "d" / "c.json.gz", gzip.compress(bom + json.dumps(_trace(id="c")).encode()))
    rc, out, err = analyze("d", tmp_path)
    assert (rc, err) == (0, "")
    assert out.startswith("loaded 3 traces (3 requests)")


@pytest.mark.parametrize(
    ("name", "compress"), [("t.json", False), ("t.jsonl", False), ("t.json.gz", True), ("t.jsonl.gz", True)]
)
def test_size_limit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    compress: bool,
) -> None:
    """Over the limit (decompressed, for .gz: a small gzip bomb) is refused, never read whole."""
    monkeypatch.setattr(loaders, "MAX_TRACE_BYTES", 4096)
    if name.startswith("t.jsonl"):
        body = "".join(json.dumps(_trace(id=f"t{i}")) + "\n" for i in range(100)).encode()
    else:
        body = json.dumps(_trace([_req() for _ in range(100)])).encode()
    assert len(body) > 4096
    path = _write(tmp_path / name, gzip.compress(body) if compress else body)
    rc = main(["analyze", str(path), "--no-plot"])
    err = capsys.readouterr().err
    what = "decompressed, it is" if compress else "it is"
    assert (rc, err) == (
        2,
        f"trace error: {path}: {what} over the 4 KiB limit for one trace file; split it\n",
    )
    monkeypatch.setattr(loaders, "MAX_TRACE_BYTES", len(body))  # exactly at the limit: fine
    assert main(["analyze", str(path), "--no-plot"]) == 0
