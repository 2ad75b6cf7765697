"""InferenceX's replay settings the replayer carries (docs/replay-parity.md), each end to end against a
real streaming server on loopback: one-token warm-up requests per lane, the whole-system idle cap and
the live failed-request threshold."""

from __future__ import annotations

import itertools

import pytest

pytestmark = pytest.mark.integration  # every test here runs a real server on loopback


def test_one_token_warmup_follows_the_primer_without_delays(tmp_path, stream_server, kit):
    server = stream_server()
    # 20 turns, 50 ms between them (5 s of think time at --time-scale 0.01), 8 tokens each.
    traces = kit.write_traces(
        tmp_path / "traces", [kit.linear_trace(f"w{i}", 20, out=8, think=5.0) for i in range(2)]
    )
    out = tmp_path / "out"
    res = kit.run_replay(
        server, traces, out, "--max-users", "2", "--time-scale", "0.01", "--ignore-eos",
        "--advance-min", "0.5", "--advance-max", "0.5", "--warmup-one-token", "--warmup-requests-per-user", "3",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    recs = kit.records(out)
    sent = {s["request_id"]: s for s in server.requests()}
    for user in (0, 1):
        mine = sorted((r for r in recs if r["user"] == user), key=lambda r: r["t_dispatch"])
        assert [r["turn"] for r in mine] == list(range(10, 20))  # the lane starts half way in
        assert [r["phase"] for r in mine] == ["warmup"] * 4 + ["profile"] * 6  # the primer, then 3
        assert [sent[r["request_id"]]["max_tokens"] for r in mine] == [8, 1, 1, 1] + [8] * 6
        assert [r["expected_output_tokens"] for r in mine[:4]] == [8, 1, 1, 1]
        assert mine[0]["prompt_tokens"] == 12 * 64  # the primer carries the whole prefix so far
        gaps = [b["t_dispatch"] - a["t_done"] for a, b in itertools.pairwise(mine)]
        assert max(gaps[:3]) < 0.04  # the one-token requests skip their 50 ms delays
        assert min(gaps[3:]) >= 0.045  # the profiled ones keep them
    assert kit.summary(out)["counts"]["warmup"] == 8


def test_the_system_idle_cap_advances_delays_only_when_nothing_is_in_flight(tmp_path, stream_server, kit):
    server = stream_server()
    # One lane, 6 turns, 40 s of think time before each (no time scale): 200 s without the cap.
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("slow", 6, think=40.0)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "1", "--system-idle-cap", "0.3", timeout=60)
    assert res.returncode == 0, res.stderr
    recs = sorted(kit.records(out), key=lambda r: r["t_dispatch"])
    gaps = [b["t_dispatch"] - a["t_done"] for a, b in itertools.pairwise(recs)]
    assert len(recs) == 6 and all(0.28 <= g < 1.0 for g in gaps), gaps
    advanced = kit.summary(out)["self_audit"]["idle_advanced_s"]
    assert advanced == pytest.approx(5 * (40.0 - 0.3), abs=1.5)
    # Off by default: the same delays, capped at 0.5 s by --max-delay, are all waited out.
    res = kit.run_replay(server, traces, tmp_path / "plain", "--max-users", "1", "--max-delay", "0.5")
    assert res.returncode == 0, res.stderr
    plain = sorted(kit.records(tmp_path / "plain"), key=lambda r: r["t_dispatch"])
    assert all(b["t_dispatch"] - a["t_done"] >= 0.49 for a, b in itertools.pairwise(plain))
    assert kit.summary(tmp_path / "plain")["self_audit"]["idle_advanced_s"] == 0.0


def test_a_lane_in_flight_keeps_the_others_delays(tmp_path, stream_server, kit):
    server = stream_server("--ttft-ms", "1500")  # every response takes 1.5 s to start
    # Lane "busy" has no think time: its requests are in flight back to back; lane "idle" thinks 1 s.
    busy = kit.linear_trace("a-busy", 6)  # in flight from 0 to 9 s, the idle lane done by 6.5 s
    idle = kit.linear_trace("b-idle", 3, think=1.0)
    traces = kit.write_traces(tmp_path / "traces", [busy, idle])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "2", "--system-idle-cap", "0.1", timeout=60)
    assert res.returncode == 0, res.stderr
    recs = sorted((r for r in kit.records(out) if r["trace_id"] == "b-idle"), key=lambda r: r["t_dispatch"])
    gaps = [b["t_dispatch"] - a["t_done"] for a, b in itertools.pairwise(recs)]
    assert all(g >= 0.95 for g in gaps), gaps  # the other lane was in flight: nothing advanced


def test_too_many_failed_requests_end_the_run(tmp_path, stream_server, kit):
    server = stream_server("--fail-turns", ",".join(str(t) for t in range(3, 40)))
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"f{i}", 40) for i in range(3)])
    out = tmp_path / "out"
    res = kit.run_replay(
        server, traces, out, "--max-users", "3", "--failed-request-threshold", "0.1", "--time-scale", "0.001"
    )
    assert res.returncode == 1, res.stderr
    assert "over --failed-request-threshold 0.1" in res.stderr.strip().splitlines()[-1]
    summ = kit.summary(out)
    assert summ["self_audit"]["stop_reason"] == "failed_requests"
    assert summ["counts"]["sent"] < 3 * 40  # stopped early, its files complete
    assert summ["counts"]["failed"] > 0.1 * 20
