"""The engine process: bounded health wait, early death with the last log line, group stop, log bounds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from agentsweep.cell.engine_process import EngineFailed, EngineProcess, tail_lines, trim_log
from agentsweep.cell.placement import free_port

from tests.support import pid_running, poll_until

pytestmark = pytest.mark.integration


def _engine(standins, tmp_path: Path, *flags: str, grace: float = 5.0) -> EngineProcess:
    port = free_port()
    return EngineProcess(
        [*standins["engine"], "--port", str(port), *flags],
        log_path=tmp_path / "server.log",
        base_url=f"http://127.0.0.1:{port}",
        stop_grace_s=grace,
    )


def test_healthy_engine(standins, tmp_path):
    with _engine(standins, tmp_path) as engine:
        waited = engine.wait_healthy(20)
        assert 0 <= waited < 20
        assert engine.poll() is None
    assert engine.poll() is not None  # stopped on exit


def test_never_healthy_fails_within_the_timeout(standins, tmp_path):
    with _engine(standins, tmp_path, "--mode", "never") as engine:
        start = time.monotonic()
        with pytest.raises(EngineFailed) as err:
            engine.wait_healthy(1.5, poll_s=0.1)
        assert time.monotonic() - start < 4
    assert "engine not healthy after 1.5 s" in str(err.value)
    assert "HTTP 503" in str(err.value)
    assert str(err.value).endswith("; last log line: standin engine starting")


def test_death_while_loading_fails_early_with_the_last_log_line(standins, tmp_path):
    with _engine(standins, tmp_path, "--mode", "crash-at-start") as engine:
        start = time.monotonic()
        with pytest.raises(EngineFailed) as err:
            engine.wait_healthy(60, poll_s=0.1)
        assert time.monotonic() - start < 10  # long before the timeout
    assert str(err.value) == (
        "engine exited with status 3 before becoming healthy; "
        "last error in server.log: RuntimeError: CUDA out of memory while loading weights"
    )


def test_stop_kills_the_whole_group_after_the_grace(standins, tmp_path):
    pid_file = tmp_path / "child.pid"
    engine = _engine(standins, tmp_path, "--ignore-term", "--child-pid-file", str(pid_file), grace=0.5)
    with engine:
        engine.wait_healthy(20)
        child = int(pid_file.read_text())
        start = time.monotonic()
    assert time.monotonic() - start < 6
    assert engine.poll() is not None
    poll_until(lambda: not pid_running(child), timeout=5)
    assert not pid_running(child), "a worker that ignores SIGTERM must not outlive the cell"


def test_missing_executable_is_a_clear_failure(tmp_path):
    engine = EngineProcess(
        ["/nonexistent/vllm", "serve"], log_path=tmp_path / "s.log", base_url="http://127.0.0.1:1"
    )
    with pytest.raises(EngineFailed, match=r"cannot start the engine \(/nonexistent/vllm\)"):
        engine.start()


def test_trim_log_keeps_head_and_tail(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert trim_log(log, max_bytes=20_000, head_bytes=5_000)
    text = log.read_text()
    assert len(text) <= 20_100
    assert text.startswith("line 0\n")
    assert text.endswith("line 99999\n")
    assert "bytes omitted to keep this log bounded" in text
    assert tail_lines(log, 2) == ["line 99998", "line 99999"]
    assert not trim_log(log, max_bytes=1_000_000)
