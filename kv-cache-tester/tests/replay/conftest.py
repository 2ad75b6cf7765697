"""Fixtures for the replayer tests: a real streaming server on loopback and small synthetic traces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SERVER = HERE / "stream_server.py"
ENTRY = HERE.parent.parent / "trace_replay_tester.py"  # kv-cache-tester/trace_replay_tester.py


@dataclass
class Server:
    proc: subprocess.Popen[str]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def stream_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(*extra: str) -> Server:
        log = tmp_path / f"server_{len(started)}.jsonl"
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--log", str(log), *extra],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), f"server did not start: {line!r}"
        server = Server(proc, int(line.split()[1]), log)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def request(t: float, in_tokens: int, out: int, ids: list[int], think: float = 0.0, api: float = 0.1) -> dict:
    return {
        "t": t,
        "type": "s",
        "model": "m",
        "in": in_tokens,
        "out": out,
        "hash_ids": ids,
        "input_types": ["text"],
        "output_types": ["text"],
        "stop": "end_turn",
        "api_time": api,
        "think_time": think,
    }


def linear_trace(trace_id: str, turns: int, out: int = 4, think: float = 0.0, first_blocks: int = 2) -> dict:
    """A conversation whose every turn extends the previous one by one 64-token block."""
    reqs = []
    for i in range(turns):
        n = first_blocks + i
        reqs.append(request(float(i), n * 64, out, list(range(1, n + 1)), think=think))
    return {"id": trace_id, "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": reqs}


def write_traces(folder: Path, traces: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for tr in traces:
        (folder / f"{tr['id']}.json").write_text(json.dumps(tr))
    return folder


def replay_cmd(server: Server, traces: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ENTRY),
        "--api-endpoint",
        server.url,
        "--trace-directory",
        str(traces),
        "--output-dir",
        str(out),
        "--no-color",
        "--no-plot",
        *extra,
    ]


def run_replay(
    server: Server, traces: Path, out: Path, *extra: str, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        replay_cmd(server, traces, out, *extra), capture_output=True, text=True, timeout=timeout
    )


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


def terminate(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    os.kill(proc.pid, sig)


class Kit:
    """The helpers above, handed to tests as a fixture (test modules cannot import conftest)."""

    entry = ENTRY
    request = staticmethod(request)
    linear_trace = staticmethod(linear_trace)
    write_traces = staticmethod(write_traces)
    replay_cmd = staticmethod(replay_cmd)
    run_replay = staticmethod(run_replay)
    records = staticmethod(records)
    summary = staticmethod(summary)
    terminate = staticmethod(terminate)


@pytest.fixture
def kit() -> type[Kit]:
    return Kit
