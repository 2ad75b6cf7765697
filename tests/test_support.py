"""The shared test support: waits say what they awaited, and never return before or after they should."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading

import pytest

from tests.support import WaitTimeout, poll_until, wait_for_file, wait_for_line, wait_until


def _counter(true_from: int):  # type: ignore[no-untyped-def]
    calls = {"n": 0}

    def condition() -> int:
        calls["n"] += 1
        return calls["n"] if calls["n"] >= true_from else 0

    return condition, calls


def test_wait_until_returns_the_first_true_value():
    condition, calls = _counter(3)
    assert wait_until(condition, timeout=5, interval=0.001, what="three calls") == 3
    assert calls["n"] == 3


def test_wait_until_names_what_it_awaited():
    with pytest.raises(WaitTimeout, match=r"^timed out after 0\.1 s waiting for the moon$"):
        wait_until(lambda: False, timeout=0.1, interval=0.01, what="the moon")


def test_poll_until_returns_the_last_value_and_leaves_the_assert_to_the_caller():
    assert poll_until(lambda: [], timeout=0.05, interval=0.01) == []
    condition, _ = _counter(2)
    assert poll_until(condition, timeout=5, interval=0.001) == 2


def test_wait_for_file_waits_for_the_file_and_with_nonempty_for_content(tmp_path):
    path = tmp_path / "requests.jsonl"
    with pytest.raises(WaitTimeout, match=r"requests\.jsonl to appear"):
        wait_for_file(path, timeout=0.1)
    path.touch()
    assert wait_for_file(path, timeout=0.1) == path
    with pytest.raises(WaitTimeout, match=r"requests\.jsonl to have content"):
        wait_for_file(path, timeout=0.1, nonempty=True)
    threading.Timer(0.05, path.write_text, args=("{}\n",)).start()
    assert wait_for_file(path, timeout=5, nonempty=True) == path


def test_wait_for_line_stops_at_the_match_and_keeps_what_it_read():
    stream = io.StringIO("loading\nready on port 8123\nafter\n")
    found = wait_for_line(stream, r"port (\d+)", timeout=5, what="the port")
    assert found.match.group(1) == "8123"
    assert found.lines == ["loading\n", "ready on port 8123\n"]
    assert stream.readline() == "after\n"  # the rest is left unread


def test_wait_for_line_fails_with_the_lines_read_when_the_output_ends_or_stalls():
    with pytest.raises(WaitTimeout, match=r"the output ended before the port; read:\nloading\n"):
        wait_for_line(io.StringIO("loading\n"), r"port", timeout=5, what="the port")
    read_end, write_end = os.pipe()
    with open(read_end) as stalled, open(write_end, "w") as writer:
        writer.write("loading\n")
        writer.flush()
        with pytest.raises(
            WaitTimeout, match=r"timed out after 0\.2 s waiting for the port; read:\nloading\n"
        ):
            wait_for_line(stalled, r"port", timeout=0.2, what="the port")


@pytest.mark.integration
def test_a_process_that_ends_first_fails_the_wait_with_its_output():
    proc = subprocess.Popen(
        [sys.executable, "-c", "print('cannot bind'); raise SystemExit(3)"], stdout=subprocess.PIPE, text=True
    )
    with pytest.raises(WaitTimeout, match=r"exited with status 3 while waiting for health\ncannot bind"):
        wait_until(lambda: False, timeout=30, what="health", process=proc)


def test_the_rewrite_cache_warm_up_finds_modules_without_a_fresh_cache_and_splits_them_evenly(tmp_path):
    from tests.support.warm_rewrite_cache import shares, stale_modules

    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}"
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    fresh, old, new, helper = (
        tmp_path / "pkg" / n for n in ("test_a.py", "test_b.py", "test_c.py", "util.py")
    )
    for path, size in ((fresh, 10), (old, 300), (new, 200), (helper, 5)):
        path.write_text("#" * size)
    (tmp_path / "pkg" / "__pycache__" / f"test_a.{tag}.pyc").write_bytes(b"")
    stale_pyc = tmp_path / "pkg" / "__pycache__" / f"test_b.{tag}.pyc"
    stale_pyc.write_bytes(b"")
    os.utime(stale_pyc, (old.stat().st_mtime - 10, old.stat().st_mtime - 10))  # older than its source
    assert stale_modules((tmp_path,)) == [old, new]  # not the cached one, nor a module that is no test
    assert shares([old, new, fresh], 2) == [[old], [new, fresh]]  # by size: 300 | 200 + 10
    assert shares([old], 4) == [[old]]


@pytest.mark.integration
def test_wait_for_http_takes_an_answer_only_from_the_process_meant_to_serve(tmp_path):
    """Another process's server on the port answers the health check; a wait for this process's
    server does not take that answer, and fails when this process dies of the taken port."""
    from tests.support import free_port, wait_for_http

    port = free_port()
    serve = [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(tmp_path),
    ]
    other = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/", process=other)  # its own answer: taken
        late = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with pytest.raises(WaitTimeout, match="the process exited with status 1") as err:
            wait_for_http(f"http://127.0.0.1:{port}/", process=late, timeout=20)
        assert "Address already in use" in str(err.value)
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            with pytest.raises(WaitTimeout, match="timed out"):
                wait_for_http(f"http://127.0.0.1:{port}/", process=bystander, timeout=1)
        finally:
            bystander.kill()
            bystander.wait()
    finally:
        other.kill()
        other.wait()
