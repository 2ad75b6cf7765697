"""Every trace shape replays, every run ends on time and says why it failed.

Against a real server on loopback: the test stream server, with its stall fault for streams that
stop mid-way.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kv_cache_tester.errors import RunAborted
from kv_cache_tester.replay import app
from kv_cache_tester.replay.cli import add_arguments
from kv_cache_tester.replay.config import from_args
from kv_cache_tester.replay.loop import Replayer
from kv_cache_tester.replay.prompts import PayloadBuilder
from kv_cache_tester.replay.recorder import Recorder
from kv_cache_tester.traces.loaders import load_traces

pytestmark = pytest.mark.integration  # every test here runs a real server on loopback


def req(n_blocks: int, think: float = 0.0, out: int = 3) -> dict:
    ids = list(range(1, n_blocks + 1))
    return {
        "t": 0.0, "type": "s", "model": "m", "in": n_blocks * 64, "out": out, "hash_ids": ids,
        "input_types": ["text"], "output_types": ["text"], "stop": "", "api_time": 0.05,
        "think_time": think,
    }  # fmt: skip


def agent(name: str, n: int) -> dict:
    return {
        "t": 0.0, "type": "subagent", "agent_id": name, "subagent_type": "Explore", "duration_ms": 100,
        "status": "completed", "tool_tokens": 0, "system_tokens": 0,
        "requests": [req(2 + i, think=0.2) for i in range(n)],
    }  # fmt: skip


def trace(trace_id: str, entries: list[dict]) -> dict:
    return {"id": trace_id, "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": entries}


def analyze_count(traces: Path) -> int:
    res = subprocess.run(
        [sys.executable, "-m", "kv_cache_tester.cli", "analyze", str(traces), "--no-plot"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    m = re.search(r"^requests (\d+):", res.stdout, re.MULTILINE)
    assert m, res.stdout
    return int(m.group(1))


def test_sub_agents_before_the_first_parent_request_are_replayed(tmp_path, stream_server, kit):
    server = stream_server("--itl-ms", "2")
    shape = trace("first", [agent("a", 2), agent("b", 1), req(3, think=0.5), req(4, think=0.5)])
    traces = kit.write_traces(tmp_path / "traces", [shape])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "1", "--time-scale", "0.05")
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    assert len(recs) == analyze_count(traces) == 5
    assert kit.summary(out)["counts"]["sent"] == 5
    t = {s["request_id"]: (s["t_in"], s["t_out"]) for s in server.requests()}
    agents = [t["first:a#0"], t["first:a#1"], t["first:b#0"]]
    assert all(t["first#0"][0] >= a[1] for a in agents)  # the first parent request joins the group


def test_a_trace_of_only_sub_agents_replays_all_of_it(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [trace("only", [agent("a", 2), agent("b", 2)])])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "1", "--time-scale", "0.01")
    assert res.returncode == 0, res.stderr
    assert len(kit.records(out)) == analyze_count(traces) == 4
    assert {r["session_id"] for r in kit.records(out)} == {"only:a", "only:b"}


def test_a_recycled_sub_agent_only_trace_runs_its_duration_and_ends_on_time(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [trace("only", [agent("a", 2)])])
    out = tmp_path / "out"
    t0 = time.monotonic()
    res = kit.run_replay(
        server, traces, out, "--max-users", "1", "--recycle", "--time-scale", "0.01", "--test-duration", "2",
        timeout=30,
    )  # fmt: skip
    assert time.monotonic() - t0 < 15
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    assert len(recs) > 4 and max(r["play"] for r in recs) >= 2  # played again and again
    assert kit.summary(out)["self_audit"]["stop_reason"] == "duration"


def _started(cmd: list[str], out: Path, n: int) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    path = out / "requests.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    pytest.fail("the replay recorded nothing")


def _ends_on_sigterm(proc: subprocess.Popen, within: float) -> tuple[float, str]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"still running {within} s after SIGTERM")
    return time.monotonic() - t0, err


def test_sigterm_ends_a_recycling_sub_agent_only_run(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [trace("only", [agent("a", 3)])])
    out = tmp_path / "out"
    cmd = kit.replay_cmd(server, traces, out, "--max-users", "1", "--recycle", "--time-scale", "0.01")
    proc = _started(cmd, out, 6)
    took, err = _ends_on_sigterm(proc, 10)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert took < 5
    assert kit.summary(out)["counts"]["sent"] == len(kit.records(out)) > 0


@pytest.fixture
def stalling_server(stream_server):
    """A server whose responses after the 4th stop half-way, connection held open."""
    return stream_server("--stall-after", "4")


def _stall_cmd(server, kit, traces: Path, out: Path, *extra: str) -> list[str]:
    return kit.replay_cmd(server, traces, out, "--time-scale", "0.001", "--max-users", "2", *extra)


@pytest.mark.slow
def test_a_stalled_stream_fails_as_stall_within_the_run(tmp_path, stalling_server, kit):
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"s{i}", 6, out=20) for i in range(2)])
    out = tmp_path / "out"
    cmd = _stall_cmd(
        stalling_server, kit, traces, out, "--stall-timeout", "0.5", "--recycle", "--test-duration", "4"
    )
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 20
    assert res.returncode == 0, res.stderr
    stalled = [r for r in kit.records(out) if r["status"] == "error"]
    assert len(stalled) >= 4  # both lanes went on after their stalls, and stalled again
    assert {r["error"]["class"] for r in stalled} == {"stall"}
    assert all("--stall-timeout" in r["error"]["message"] and r["ttft_s"] is not None for r in stalled)
    summ = kit.summary(out)
    assert summ["counts"]["failed_by_class"] == {"stall": len(stalled)}
    assert summ["self_audit"]["abandoned_in_flight"] == 0


@pytest.mark.slow
def test_requests_abandoned_at_the_end_are_recorded_failures(tmp_path, stalling_server, kit):
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"s{i}", 6, out=20) for i in range(2)])
    out = tmp_path / "out"
    cmd = _stall_cmd(
        stalling_server,
        kit,
        traces,
        out,
        "--stall-timeout",
        "0",
        "--test-duration",
        "1.5",
        "--grace-period",
        "1.5",
    )
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    summ = kit.summary(out)
    abandoned = summ["self_audit"]["abandoned_in_flight"]
    assert abandoned == 2  # one stalled request per lane
    failed = [r for r in kit.records(out) if r["status"] == "error"]
    assert len(failed) == abandoned and {r["error"]["class"] for r in failed} == {"stall"}
    assert all("abandoned at the end of the run" in r["error"]["message"] for r in failed)
    assert summ["counts"]["failed_by_class"] == {"stall": 2}


@pytest.mark.slow
def test_sigterm_while_streams_are_stalled_ends_in_seconds_with_the_records(tmp_path, stalling_server, kit):
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"s{i}", 6, out=20) for i in range(2)])
    out = tmp_path / "out"
    cmd = _stall_cmd(stalling_server, kit, traces, out, "--grace-period", "1", "--test-duration", "600")
    proc = _started(cmd, out, 4)
    time.sleep(0.5)  # both lanes are now on a stalled stream
    took, err = _ends_on_sigterm(proc, 15)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert took < 6
    failed = [r for r in kit.records(out) if r["status"] == "error"]
    assert len(failed) == 2 and {r["error"]["class"] for r in failed} <= {"stall", "timeout"}
    assert kit.summary(out)["counts"]["failed"] == 2


def _config(server_url: str, traces: Path, out: Path, *extra: str):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(
        ["--api-endpoint", server_url, "--trace-directory", str(traces), "--output-dir", str(out), *extra]
    )
    return from_args(ns)


class BrokenBuilder(PayloadBuilder):
    """A payload builder that breaks on the third parent request (a fault put in on purpose)."""

    def build(self, scope, agent, req, one_token=False):  # type: ignore[no-untyped-def]
        if agent is None and req.index == 2:
            raise ValueError("no body for request 2")
        return super().build(scope, agent, req, one_token)


def test_a_lane_that_raises_stops_the_run_and_fails_it(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("t0", 5)])
    out = tmp_path / "out"
    cfg = _config(server.url, traces, out, "--model", "m", "--no-plot")
    loaded = load_traces(str(traces)).traces
    out_dir = app.prepare_output(cfg)
    recorder = Recorder(out_dir)
    builder = BrokenBuilder(
        api="chat", model="m", seed=0, ignore_eos=False, send_max_tokens=True, mode="words"
    )
    replayer = Replayer(cfg, loaded, app.lanes_for(cfg), app.pool_for(cfg, len(loaded)), builder, recorder)
    meta = asyncio.run(replayer.run())
    recorder.close()
    assert meta.errors == ["lane 0: ValueError: no body for request 2"]
    assert meta.reason == "error"
    assert len(kit.records(out)) == 2  # what was sent before is on disk
    with pytest.raises(RunAborted, match=r"lane 0: ValueError: no body for request 2; 2 requests recorded"):
        app.finish(cfg, out_dir, [meta], {})
    assert kit.summary(out)["counts"]["sent"] == 2


def test_a_run_that_sent_nothing_fails_with_one_line(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("t0", 3)])
    out = tmp_path / "out"
    cfg = _config(server.url, traces, out, "--model", "m", "--no-plot")
    loaded = load_traces(str(traces)).traces
    out_dir = app.prepare_output(cfg)
    recorder = Recorder(out_dir)
    builder = app.make_builder(cfg, "m")
    replayer = Replayer(cfg, loaded, app.lanes_for(cfg), app.pool_for(cfg, len(loaded)), builder, recorder)

    async def go():
        task = asyncio.get_running_loop().create_task(replayer.run())
        await asyncio.sleep(0)
        replayer.stop("duration")  # before the start
        return await task

    meta = asyncio.run(go())
    recorder.close()
    with pytest.raises(RunAborted, match=r"no request was sent \(stop reason: duration"):
        app.finish(cfg, out_dir, [meta], {})


def test_an_html_200_is_a_protocol_error_and_does_not_trip_the_breaker(tmp_path, stream_server, kit):
    server = stream_server("--bad", "html")
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"h{i}", 40) for i in range(2)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "2", "--time-scale", "0.05", timeout=60)
    assert res.returncode == 0, res.stderr  # the server is up: no circuit breaker
    summ = kit.summary(out)
    assert summ["counts"]["failed_by_class"] == {"protocol": 80}
    assert summ["self_audit"]["stop_reason"] == "exhausted"


def test_usage_that_cannot_be_true_is_recorded_as_bad_usage(tmp_path, stream_server, kit):
    server = stream_server("--bad", "usage")
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("u0", 3)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "1")
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    assert len(recs) == 3 and {r["error"]["class"] for r in recs} == {"bad_usage"}
    assert all(r["cached_tokens"] == 10_000_000 and r["prompt_tokens_source"] == "server" for r in recs)
    assert all(r["error"]["usage"]["cached_tokens"] == 10_000_000 for r in recs)
    assert kit.summary(out)["cache"]["client_hit_rate"] is None  # no hit rate of 10,000,000 / 130


def test_a_run_cut_by_its_duration_counts_what_it_did_not_send(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("long", 50, think=1.0)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "1", "--test-duration", "1.5")
    assert res.returncode == 0, res.stderr
    summ = kit.summary(out)
    assert summ["counts"]["sent"] == 2  # request 0, then request 1 after its 1 s think time
    assert summ["self_audit"]["unsent_requests"] == 48


@pytest.fixture
def server_stalling_after_one(stream_server):
    """A server whose responses after the first stop half-way, connection held open."""
    return stream_server("--stall-after", "1")


@pytest.mark.slow
def test_a_sub_agent_in_flight_when_the_run_stops_is_recorded(tmp_path, server_stalling_after_one, kit):
    """The parent lane is in a long think time when the run stops; its sub-agent's request, in flight
    on the server, must still end as a record (an abandoned failure), never vanish with the lane."""
    parent_next = {**req(6), "think_time": 10_000.0}  # 10 s at --time-scale 0.001: asleep at the stop
    traces = kit.write_traces(tmp_path / "traces", [trace("p", [req(4), agent("a1", 1), parent_next])])
    out = tmp_path / "out"
    cmd = _stall_cmd(
        server_stalling_after_one, kit, traces, out, "--max-users", "1", "--stall-timeout", "0",
        "--test-duration", "1.5", "--grace-period", "1.0", "--max-delay", "100000",
    )  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    records = kit.records(out)
    assert [r["session_id"] for r in records] == ["p", "p:a1"], res.stderr
    child = records[1]
    assert child["status"] == "error" and "abandoned at the end of the run" in child["error"]["message"]
