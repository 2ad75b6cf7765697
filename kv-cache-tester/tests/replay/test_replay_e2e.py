"""The replay command end to end against a real streaming server on loopback."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration  # every test here runs a real server on loopback


def sub_agent_trace(trace_id: str) -> dict:
    """parent 0 -> group of two sub-agents (two requests each) -> parent 1 (the join) -> parent 2."""

    def r(t, n, ids, out=3, think=0.0):
        return {
            "t": t, "type": "s", "model": "m", "in": n, "out": out, "hash_ids": ids,
            "input_types": ["text"], "output_types": ["text"], "stop": "", "api_time": 0.05,
            "think_time": think,
        }  # fmt: skip

    def agent(name, base):
        return {
            "t": 0.2, "type": "subagent", "agent_id": name, "subagent_type": "Explore", "duration_ms": 100,
            "status": "completed", "tool_tokens": 0, "system_tokens": 0,
            "requests": [r(0.0, 128, [base, base + 1]), r(1.0, 192, [base, base + 1, base + 2], think=0.5)],
        }  # fmt: skip

    return {
        "id": trace_id, "models": ["m"], "block_size": 64, "hash_id_scope": "local",
        "requests": [
            r(0.0, 128, [1, 2]),
            agent("agent_a", 100),
            agent("agent_b", 200),
            r(5.0, 192, [1, 2, 3], think=1.0),
            r(6.0, 256, [1, 2, 3, 4], think=1.0),
        ],
    }  # fmt: skip


def test_every_request_recorded_prefix_growth_and_session_headers(tmp_path, stream_server, kit):
    server = stream_server("--keep-prompts")
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"tr{i}", 5) for i in range(3)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "3", "--time-scale", "0.01", "--ignore-eos")
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    seen = server.requests()
    assert len(recs) == len(seen) == 15
    assert sorted(r["request_id"] for r in recs) == sorted(s["request_id"] for s in seen)
    assert all(r["status"] == "ok" for r in recs)
    by_session = defaultdict(list)
    for s in seen:
        by_session[s["session"]].append(s)
    assert sorted(by_session) == ["tr0", "tr1", "tr2"]
    for reqs in by_session.values():
        reqs.sort(key=lambda s: s["t_in"])
        assert [s["words"] for s in reqs] == [128, 192, 256, 320, 384]  # one word = one token
        for a, b in itertools.pairwise(reqs):
            assert b["prompt"].startswith(a["prompt"] + " ")
        assert all(s["ignore_eos"] is True and s["max_tokens"] == 4 for s in reqs)
    # different traces never share content
    firsts = {s["session"]: s["prompt"].split()[:64] for s in seen if s["words"] == 128}
    assert len({tuple(v) for v in firsts.values()}) == 3
    r0 = next(r for r in recs if r["trace_id"] == "tr0" and r["turn"] == 3)
    assert (r0["theoretical_hit_blocks"], r0["total_blocks"]) == (4, 5)
    assert r0["cached_tokens"] == 256 and r0["prompt_tokens"] == 320
    assert r0["itl_s"]["n"] == 3 and r0["session_id"] == "tr0" and r0["phase"] == "profile"
    summ = kit.summary(out)
    assert summ["counts"] == {"sent": 15, "ok": 15, "failed": 0, "failed_by_class": {}, "warmup": 0}
    assert summ["self_audit"]["first_dispatch_spread_s"] < 0.5
    assert summ["users"] == 3 and summ["options"]["max_users"] == 3
    assert 0 < summ["cache"]["theoretical_hit_rate"] < 1


def test_sub_agent_fan_out_and_join(tmp_path, stream_server, kit):
    server = stream_server("--itl-ms", "5")
    traces = kit.write_traces(tmp_path / "traces", [sub_agent_trace("sa")])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "1", "--time-scale", "0.05")
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    assert len(recs) == 7
    sessions = {r["session_id"] for r in recs}
    assert sessions == {"sa", "sa:agent_a", "sa:agent_b"}
    seen = {s["request_id"]: s for s in server.requests()}
    t = {rid: (s["t_in"], s["t_out"]) for rid, s in seen.items()}
    parent0, join = t["sa#0"], t["sa#1"]
    agents = [t[f"sa:{a}#{i}"] for a in ("agent_a", "agent_b") for i in (0, 1)]
    assert all(a[0] >= parent0[1] for a in agents)  # fan-out after the parent's previous request
    assert all(join[0] >= a[1] for a in agents)  # the join waits for every sub-agent request
    # the two sub-agents ran concurrently: each one's first request started before the other's ended
    a0, b0 = t["sa:agent_a#0"], t["sa:agent_b#0"]
    assert a0[0] < b0[1] and b0[0] < a0[1]
    assert t["sa#2"][0] >= join[1]
    assert all(r["user"] == 0 for r in recs)


def test_recycle_never_runs_a_trace_twice_at_once(tmp_path, stream_server, kit):
    server = stream_server("--itl-ms", "1")
    traces = kit.write_traces(
        tmp_path / "traces", [kit.linear_trace(f"r{i}", 3, think=1.0) for i in range(3)]
    )
    out = tmp_path / "out"
    res = kit.run_replay(
        server, traces, out, "--max-users", "2", "--recycle", "--test-duration", "2", "--time-scale", "0.01"
    )
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    plays: dict[tuple[str, int], list[float]] = {}
    for r in recs:
        span = plays.setdefault((r["trace_id"], r["play"]), [r["t_dispatch"], r["t_done"]])
        span[0], span[1] = min(span[0], r["t_dispatch"]), max(span[1], r["t_done"])
    assert max(p for _, p in plays) >= 2  # traces really were replayed
    by_trace = defaultdict(list)
    for (tid, _), span in plays.items():
        by_trace[tid].append(span)
    for spans in by_trace.values():
        spans.sort()
        for a, b in itertools.pairwise(spans):
            assert b[0] >= a[1]
    # a replayed trace gets fresh content (salt) and its own session header
    assert {r["salt"] for r in recs if r["play"] > 0} >= {"p1"}
    assert any("/p1#" in s["request_id"] for s in server.requests())


def test_more_users_than_traces_leaves_lanes_idle(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("only", 2)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "3", "--time-scale", "0.01")
    assert res.returncode == 0, res.stderr
    assert "2 lanes stay idle" in res.stderr
    assert kit.summary(out)["self_audit"]["idle_lanes"] == 2
    assert len(kit.records(out)) == 2


def test_warmup_and_advance_are_excluded_from_the_summary(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"w{i}", 10) for i in range(2)])
    out = tmp_path / "out"
    res = kit.run_replay(
        server, traces, out, "--max-users", "2", "--time-scale", "0.001",
        "--advance-min", "0.5", "--advance-max", "0.5", "--warmup-requests-per-user", "2",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    warm = [r for r in recs if r["phase"] == "warmup"]
    prof = [r for r in recs if r["phase"] == "profile"]
    assert len(recs) == 10  # each lane starts 5 turns in
    assert len(warm) == 4 and len(prof) == 6
    firsts = [min((r for r in recs if r["user"] == u), key=lambda r: r["t_dispatch"]) for u in (0, 1)]
    for f in firsts:
        assert f["turn"] == 5 and f["phase"] == "warmup"
        assert f["prompt_tokens"] == 7 * 64  # the full prefix: the engine must prefill it
        assert f["theoretical_hit_blocks"] == 0
    summ = kit.summary(out)
    assert summ["counts"]["warmup"] == 4 and summ["counts"]["sent"] == 6
    w_end = max(r["t_done"] for r in warm)
    assert (
        abs(summ["window"]["start_unix"] - (summ["window"]["end_unix"] - summ["window"]["duration_s"])) < 1e-6
    )
    in_window = [r for r in prof if r["t_done"] >= w_end]
    assert summ["throughput"]["requests_per_s"] * summ["window"]["duration_s"] == len(in_window) or (
        abs(summ["throughput"]["requests_per_s"] * summ["window"]["duration_s"] - len(in_window)) < 1e-6
    )


def _wait_for_records(out: Path, n: int, timeout: float = 20.0) -> None:
    path = out / "requests.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} records after {timeout} s")


def _complete_files(out: Path, kit) -> tuple[list[dict], dict]:
    raw = (out / "requests.jsonl").read_text()
    assert raw.endswith("\n")
    recs = [json.loads(line) for line in raw.splitlines()]
    summ = kit.summary(out)
    assert summ["counts"]["sent"] + summ["counts"]["warmup"] == len(recs)
    return recs, summ


def _sigterm_when(tmp_path, stream_server, kit, ready) -> tuple[Any, Path, int, str]:
    """A 4-user replay against a streaming server, sent SIGTERM once ``ready(out)`` holds: (the server,
    the output directory, the exit status, stderr)."""
    server = stream_server("--itl-ms", "20")
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"s{i}", 50, out=20) for i in range(4)])
    out = tmp_path / "out"
    proc = subprocess.Popen(
        kit.replay_cmd(server, traces, out, "--max-users", "4", "--time-scale", "0.001", "--test-duration", "60"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ready(out, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return server, out, proc.returncode, err


def test_sigterm_mid_run_leaves_complete_files(tmp_path, stream_server, kit):
    server, out, status, err = _sigterm_when(
        tmp_path, stream_server, kit, lambda out, _proc: _wait_for_records(out, 8)
    )
    assert status == 128 + signal.SIGTERM, err
    recs, summ = _complete_files(out, kit)
    assert summ["self_audit"]["stop_reason"] == "signal"
    assert summ["self_audit"]["abandoned_in_flight"] == 0  # in-flight requests finished in the grace period
    assert len(recs) == len(server.requests())


def _records_file_appears(out: Path, proc: subprocess.Popen[str]) -> None:
    """A tight poll: the signal lands as requests.jsonl appears."""
    deadline = time.monotonic() + 30
    while not (out / "requests.jsonl").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "no records file"
        time.sleep(0.0005)


def test_sigterm_the_moment_the_records_file_appears_still_leaves_complete_files(
    tmp_path, stream_server, kit
):
    """A cell stopping just as its replay starts: a signal from the moment the output files exist is
    noted and handed to the run, so it ends with its summary instead of the process dying on the
    default action (kv_cache_tester.replay.app.NotedSignals)."""
    server, out, status, err = _sigterm_when(tmp_path, stream_server, kit, _records_file_appears)
    assert status == 128 + signal.SIGTERM, err
    raw = (out / "requests.jsonl").read_text()
    assert raw == "" or raw.endswith("\n")  # no record yet, or whole ones
    summ = kit.summary(out)
    assert summ["self_audit"]["stop_reason"] == "signal"
    assert (
        summ["counts"]["sent"] + summ["counts"]["warmup"] == len(raw.splitlines()) == len(server.requests())
    )


def test_server_killed_mid_run_trips_the_breaker(tmp_path, stream_server, kit):
    server = stream_server("--itl-ms", "10")
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"k{i}", 200, out=10) for i in range(3)])
    out = tmp_path / "out"
    proc = subprocess.Popen(
        kit.replay_cmd(server, traces, out, "--max-users", "3", "--time-scale", "0.001", "--test-duration", "120"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_records(out, 6)
        server.kill()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("run aborted: server 127.0.0.1:") and "circuit breaker" in last, err
    _, summ = _complete_files(out, kit)
    assert summ["self_audit"]["stop_reason"] == "breaker"
    assert summ["counts"]["failed"] >= 1
    assert set(summ["counts"]["failed_by_class"]) <= {"connect", "stream_cut"}


@pytest.mark.slow
def test_workers_split_lanes_and_traces(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"p{i}", 4) for i in range(4)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "4", "--workers", "2", "--time-scale", "0.001")
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    assert len(recs) == 16 == len(server.requests())
    assert sorted({r["user"] for r in recs}) == [0, 1, 2, 3]
    assert {r["trace_id"] for r in recs} == {"p0", "p1", "p2", "p3"}
    summ = kit.summary(out)
    assert summ["self_audit"]["workers"] == 2 and summ["counts"]["ok"] == 16


def test_completions_api_sends_token_ids(tmp_path, stream_server, kit):
    server = stream_server("--keep-prompts")
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("c", 2)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "1", "--api", "completions", "--no-max-tokens")
    assert res.returncode == 0, res.stderr
    seen = server.requests()
    assert [s["path"] for s in seen] == ["/v1/completions"] * 2
    assert all(s["max_tokens"] is None for s in seen)
    assert all(w.isdigit() for w in seen[0]["prompt"].split()) and seen[0]["words"] == 128


def test_bad_input_is_one_line_exit_2(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("b", 2)])
    res = kit.run_replay(server, traces, tmp_path / "o", "--advance-min", "0.8", "--advance-max", "0.2")
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "--advance-min" in res.stderr
    res = kit.run_replay(server, tmp_path / "missing", tmp_path / "o")
    assert res.returncode == 2 and "missing" in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.json").write_text("{not json")
    res = kit.run_replay(server, tmp_path / "bad", tmp_path / "o")
    assert res.returncode == 2 and "x.json" in res.stderr and "Traceback" not in res.stderr


def test_unreachable_server_exit_1(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("u", 2)])
    server.kill()
    res = kit.run_replay(server, traces, tmp_path / "o")
    assert res.returncode == 1 and "cannot reach" in res.stderr and "Traceback" not in res.stderr


def test_busy_poll_run_records_every_request(tmp_path, stream_server, kit):
    server = stream_server("--itl-ms", "2")
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"tr{i}", 4) for i in range(2)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "2", "--time-scale", "0.01", "--busy-poll")
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    assert len(recs) == len(server.requests()) == 8 and all(r["status"] == "ok" for r in recs)
    # A loaded machine may read a whole short stream in one go: first and last token arrive together.
    assert all(0 < r["ttft_s"] <= r["e2e_s"] for r in recs)
    assert kit.summary(out)["options"]["busy_poll"] is True
