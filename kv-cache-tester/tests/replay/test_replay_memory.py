"""The replayer's memory bound (docs/replayer.md, "Memory"): stated, enforced, and measured on a real
replayer process with a trace of huge requests and --max-context 0."""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kv_cache_tester.errors import UsageError
from kv_cache_tester.replay.cli import add_arguments
from kv_cache_tester.replay.config import from_args
from kv_cache_tester.replay.memory import (
    BYTES_PER_TOKEN,
    GIB,
    MAX_PROMPT_TOKENS,
    check_prompt_memory,
    held_tokens,
    prompt_memory_bytes,
    rss_bytes,
)
from kv_cache_tester.traces.model import Request, SubAgent, SubAgentGroup, Trace

INSTANT = Path(__file__).resolve().parents[2] / "benchmarks" / "instant_server.py"
MEMORY_LINE = re.compile(r"memory: (\d+) MiB after loading the traces; prompts held at most (\d+) MiB")
SLACK_MIB = 64  # the fixed part of the stated bound


def _req(i: int, n: int) -> Request:
    return Request(index=i, t=float(i), in_tokens=n, out_tokens=4, hash_ids=[1])


def _trace(tid: str, parent: list[int], agents: tuple[list[int], ...] = ()) -> Trace:
    groups = []
    if agents:
        subs = [
            SubAgent(agent_id=f"a{k}", subagent_type="x", requests=[_req(j, n) for j, n in enumerate(sizes)])
            for k, sizes in enumerate(agents)
        ]
        groups.append(SubAgentGroup(join_index=1, agents=subs))
    return Trace(
        trace_id=tid,
        source="test",
        block_size=64,
        hash_id_scope="local",
        requests=[_req(i, n) for i, n in enumerate(parent)],
        groups=groups,
    )


def test_held_tokens_sum_each_owners_longest_prompt() -> None:
    trace = _trace("t", [100, 300, 200], agents=([50, 70], [10]))
    assert held_tokens(trace) == 300 + 70 + 10


def test_prompt_memory_counts_the_busiest_traces_once_per_lane() -> None:
    traces = [_trace("a", [1000]), _trace("b", [3000]), _trace("c", [2000])]
    assert prompt_memory_bytes(traces, 2, "words") == (3000 + 2000) * BYTES_PER_TOKEN["words"]
    assert prompt_memory_bytes(traces, 10, "ids") == 6000 * BYTES_PER_TOKEN["ids"]


def test_a_run_over_the_prompt_memory_limit_is_refused_in_one_line() -> None:
    traces = [_trace(f"t{i}", [MAX_PROMPT_TOKENS]) for i in range(100)]
    with pytest.raises(UsageError) as err:
        check_prompt_memory(traces, 100, "words", 8.0)
    line = str(err.value)
    assert "\n" not in line
    assert "--max-prompt-memory 8 GiB" in line and "--max-users" in line
    assert check_prompt_memory(traces, 1, "words", 8.0) < 8 * GIB


def _ns(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(
        ["--api-endpoint", "http://127.0.0.1:1", "--trace-directory", "x", "--output-dir", "o", *argv]
    )


def test_max_context_above_the_prompt_limit_is_refused() -> None:
    assert from_args(_ns("--max-context", str(MAX_PROMPT_TOKENS))).max_context == MAX_PROMPT_TOKENS
    with pytest.raises(UsageError, match="--max-context"):
        from_args(_ns("--max-context", str(MAX_PROMPT_TOKENS + 1)))
    with pytest.raises(UsageError, match="--max-prompt-memory"):
        from_args(_ns("--max-prompt-memory", "nan"))


def test_rss_of_this_process_is_known() -> None:
    assert rss_bytes() > 10 << 20


# -- a real replayer process ------------------------------------------------------------------------


def _huge_traces(folder: Path, users: int, tokens: int) -> None:
    """``users`` traces growing to ``tokens`` tokens, and one that asks for 2**31 - 1 tokens."""
    folder.mkdir()
    for u in range(users):
        sizes = [tokens // 3, 2 * tokens // 3, tokens]
        reqs = [
            {"t": float(i), "in": n, "out": 4, "hash_ids": list(range(1, n // 64 + 1))}
            for i, n in enumerate(sizes)
        ]
        doc = {"id": f"big{u}", "block_size": 64, "hash_id_scope": "local", "requests": reqs}
        (folder / f"big{u}.json").write_text(json.dumps(doc))
    huge = [{"t": 0.0, "in": 1000, "out": 4, "hash_ids": [1]}]
    huge += [{"t": 1.0 + i, "in": 2**31 - 1, "out": 4, "hash_ids": [1, 2]} for i in range(3)]
    doc = {"id": "huge", "block_size": 64, "hash_id_scope": "local", "requests": huge}
    (folder / "huge.json").write_text(json.dumps(doc))


@pytest.fixture
def instant() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(INSTANT), "--port", "0", "--force-output-tokens", "4"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), line
    yield f"http://127.0.0.1:{line.split()[1]}"
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


def _start(url: str, traces: Path, out: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "kv_cache_tester.cli", "replay", "--api-endpoint", url,
        "--trace-directory", str(traces), "--output-dir", str(out), "--max-context", "0",
        "--no-plot", "--no-color", "--model", "instant", "--progress-interval", "3600", *extra,
    ]  # fmt: skip
    with log.open("wb") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)


def _watch(proc: subprocess.Popen[bytes], limit_s: float) -> int:
    """Peak RSS of ``proc`` until it exits (killed, and the test failed, after ``limit_s``)."""
    peak = 0
    deadline = time.monotonic() + limit_s
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"the replayer ran past {limit_s:g} s")
        peak = max(peak, rss_bytes(proc.pid))
        time.sleep(0.02)
    return peak


@pytest.mark.integration
def test_replayer_rss_stays_under_the_stated_bound_with_huge_requests(instant: str, tmp_path: Path) -> None:
    traces, log = tmp_path / "traces", tmp_path / "replay.log"
    _huge_traces(traces, users=3, tokens=MAX_PROMPT_TOKENS // 2)
    proc = _start(instant, traces, tmp_path / "out", log, "--max-users", "4", "--test-duration", "3",
                  "--grace-period", "5")  # fmt: skip
    peak = _watch(proc, limit_s=60)
    text = log.read_text()
    assert proc.returncode == 0, text
    # The huge trace was cut at the prompt limit, and said so.
    assert f"cuts at the replayer's prompt limit of {MAX_PROMPT_TOKENS} tokens" in text
    m = MEMORY_LINE.search(text)
    assert m, text
    bound_mib = int(m.group(1)) + int(m.group(2)) + SLACK_MIB
    assert bound_mib < 400  # 4 lanes of at most 2 Mi tokens each: a bound that means something
    assert peak / (1 << 20) <= bound_mib, f"peak RSS {peak >> 20} MiB over the stated bound {bound_mib} MiB"
    sent = [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    assert max(r["expected_prompt_tokens"] for r in sent) <= MAX_PROMPT_TOKENS


@pytest.mark.integration
def test_sigterm_while_building_huge_prompts_stops_the_replayer(instant: str, tmp_path: Path) -> None:
    traces, log = tmp_path / "traces", tmp_path / "replay.log"
    _huge_traces(traces, users=2, tokens=MAX_PROMPT_TOKENS)
    proc = _start(instant, traces, tmp_path / "out", log, "--max-users", "3", "--grace-period", "2")
    deadline = time.monotonic() + 30
    while "memory:" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # building the first prompts (millions of tokens)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    _watch(proc, limit_s=20)
    assert time.monotonic() - t0 < 15, log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, log.read_text()
    assert (tmp_path / "out" / "summary.json").exists()


@pytest.mark.integration
def test_a_run_over_the_prompt_memory_limit_exits_2_before_sending(instant: str, tmp_path: Path) -> None:
    traces, log = tmp_path / "traces", tmp_path / "replay.log"
    _huge_traces(traces, users=2, tokens=MAX_PROMPT_TOKENS)
    proc = _start(instant, traces, tmp_path / "out", log, "--max-users", "3", "--max-prompt-memory", "0.1")
    assert proc.wait(timeout=60) == 2
    lines = log.read_text().strip().splitlines()
    assert lines[-1].startswith("usage error: --max-prompt-memory 0.1 GiB:"), lines
    assert "Traceback" not in log.read_text()
