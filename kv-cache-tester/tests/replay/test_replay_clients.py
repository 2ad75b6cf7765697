"""One run made by several client processes (--client-count, --start-at) and merged into one."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from kv_cache_tester.replay import ResultError, merge_clients

pytestmark = pytest.mark.integration  # real replayer processes against a server on loopback


def test_two_clients_split_lanes_and_traces_start_together_and_merge_into_one_run(
    tmp_path, stream_server, kit
):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"tr{i}", 4) for i in range(6)])
    start = time.time() + 25.0  # room for both processes to start on a busy machine
    outs = [tmp_path / "clients" / str(k) for k in range(2)]
    procs = [
        subprocess.Popen(
            kit.replay_cmd(
                server,
                traces,
                out,
                "--max-users",
                "4",
                "--time-scale",
                "0.01",
                "--ignore-eos",
                "--client-count",
                "2",
                "--client-index",
                str(k),
                "--start-at",
                f"{start:.3f}",
                *(["--workers", "2"] if k == 1 else []),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k, out in enumerate(outs)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
    own = [kit.records(out) for out in outs]
    assert {r["user"] for r in own[0]} == {0, 2} and {r["user"] for r in own[1]} == {1, 3}
    assert {r["trace_id"] for r in own[0]} == {"tr0", "tr2", "tr4"}
    assert {r["trace_id"] for r in own[1]} == {"tr1", "tr3", "tr5"}
    for out in outs:  # each started at the common instant
        meta = json.loads((out / "run_meta.json").read_text())
        assert [round(m["t0_unix"] - start, 1) for m in meta["metas"]] == [0.0] * len(meta["metas"])

    merged = tmp_path / "merged"
    merged.mkdir()
    summary = merge_clients(outs, merged)
    recs = kit.records(merged)
    assert len(recs) == len(own[0]) + len(own[1]) == len(server.requests()) == 24
    assert sorted(r["request_id"] for r in recs) == sorted(s["request_id"] for s in server.requests())
    assert summary["counts"]["ok"] == 24 and summary["users"] == 4
    assert summary["self_audit"]["workers"] == 3  # one process + two workers
    assert summary["self_audit"]["first_dispatch_spread_s"] < 0.5  # one start for all four lanes
    clients = summary["self_audit"]["clients"]
    assert sorted(clients) == ["0", "1"] and clients["1"]["workers"] == 2
    assert [clients[k]["requests"] for k in ("0", "1")] == [12, 12]
    shares = [c["client_cpu_share"] for c in clients.values()]
    assert summary["self_audit"]["client_cpu_share"] == max(shares)
    assert summary["options"]["client_count"] == 2 and "client_index" not in summary["options"]
    assert kit.summary(merged) == summary


def test_merge_refuses_a_directory_that_is_not_a_clients_run(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("tr0", 2)])
    out = tmp_path / "single"
    assert kit.run_replay(server, traces, out, "--max-users", "1").returncode == 0
    with pytest.raises(ResultError, match=r"single/run_meta.json: .*(not found|missing|no such)"):
        merge_clients([out], tmp_path)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--client-count", "3"], "--client-count 3: must be between 1 and the users (2)"),
        (["--client-count", "2", "--client-index", "2"], "--client-index 2: must be between 0"),
    ],
)
def test_client_flags_out_of_range(tmp_path, stream_server, kit, flags, says):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace("tr0", 2)])
    res = kit.run_replay(server, traces, tmp_path / "o", "--max-users", "2", *flags)
    assert res.returncode == 2 and says in res.stderr
