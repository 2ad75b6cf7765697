"""collect on synthetic result directories: windowed server figures, layouts, bad cells, exit status."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.collect.aggregate import build_rows, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.collect.stream import stream_requests
from kv_cache_tester.stats import LogHistogram


def _collect(src, out, *extra) -> int:
    return main(["collect", str(src), str(out), *extra])


def test_summary_row_values_come_from_the_window(tmp_path, cell_factory, spec_cls):
    spec = spec_cls(tp=2, users=8, offload="on")
    cell_factory(tmp_path / "a", spec)
    df = to_frame(build_rows(find_cells(tmp_path / "a")))
    row = df.iloc[0]
    assert row["status"] == "SUCCESS" and row["exp_name"] == spec.exp_name
    # The fixture's warmup scrapes (before the window) add queries but no hits: a rate over the
    # whole file would read lower than the in-window 70 % / 15 %.
    assert row["gpu_hit_rate"] == pytest.approx(0.70)
    assert row["cpu_hit_rate"] == pytest.approx(0.15)
    assert row["preemptions"] == pytest.approx(spec.duration / 10.0)
    assert row["offload_bytes_gpu_to_cpu"] == pytest.approx(1e6 * spec.duration)
    assert row["output_tok_per_s_per_gpu"] == pytest.approx(spec.output_tok_per_s() / 2)
    assert row["interactivity_p90_tok_per_s"] == pytest.approx(1 / (spec.tpot_p50() * 1.3))
    assert row["theoretical_hit_rate"] == 0.92
    assert 0.3 <= row["kv_usage_mean"] <= row["kv_usage_peak"] <= 0.8
    assert row["server_rows_in_window"] == spec.duration + 1
    assert row["req_theoretical_hit_rate"] == pytest.approx(0.9)
    assert row["requests_failed"] == 2 and row["failed_by_class"] == '{"ReadTimeout":2}'


def test_both_layouts_and_the_matrix(tmp_path, cell_factory, spec_cls):
    root = tmp_path / "results"
    local = spec_cls(users=2, offload="off")
    art = spec_cls(users=4, offload="on")
    cell_factory(root, local, layout="local")
    cell_factory(root / "downloads", art, layout="artifact")
    (root / "demo" / "aggregated").mkdir()
    (root / "demo" / "aggregated" / "summary.json").write_text("{}")  # an old collect output: skipped
    missing = spec_cls(users=64, offload="noprefix")
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({"include": [s.cell_fields() for s in (local, art, missing)]}))
    out = tmp_path / "out"
    assert _collect(root, out, "--matrix", str(matrix), "--no-plots") == 1
    df = pd.read_csv(out / "summary.csv")
    assert list(df["exp_name"]) == [local.exp_name, art.exp_name, missing.exp_name]
    assert list(df["status"]) == ["SUCCESS", "SUCCESS", "MISSING"]
    assert df.loc[2, "users"] == 64 and "no result directory" in df.loc[2, "reason"]


def test_failed_and_malformed_cells_become_rows(tmp_path, cell_factory, spec_cls, capsys):
    root = tmp_path / "art"
    good = cell_factory(root, spec_cls(users=2))
    cell_factory(root, spec_cls(users=4), status="FAILED", reason="engine never became healthy")
    broken = {
        "badjson": lambda p: (p / "cell.json").write_text("{not json"),
        "nostatus": lambda p: (p / "status.txt").unlink(),
        "badsummary": lambda p: (p / "summary.json").write_text(
            json.dumps({"schema_version": 1, "counts": {}})
        ),
        "nowindow": lambda p: (p / "summary.json").write_text(
            json.dumps({**json.loads((good / "summary.json").read_text()), "window": {"start_unix": None}})
        ),
        "norequests": lambda p: (p / "requests.jsonl").unlink(),
        "mismatch": lambda p: (p / "status.txt").write_text("FAILED\nsomething\n"),
        "binary": lambda p: (p / "summary.json").write_bytes(b"\xff\xfe\x00garbage"),
    }
    for users, (name, damage) in enumerate(broken.items(), start=10):
        path = cell_factory(root, spec_cls(users=users, config_key=name))
        damage(path)
    # A truncated last line (replayer killed mid-write) is counted, not fatal.
    with (good / "requests.jsonl").open("a") as fh:
        fh.write('{"trace_id": "t1", "phase": "prof')
    out = tmp_path / "out"
    assert _collect(root, out, "--no-plots") == 1
    df = pd.read_csv(out / "summary.csv").set_index("config_key", drop=False)
    by_name = df.set_index("exp_name")
    assert by_name.loc[spec_cls(users=2).exp_name, "status"] == "SUCCESS"
    assert "1 undecodable lines" in by_name.loc[spec_cls(users=2).exp_name, "notes"]
    failed = by_name.loc[spec_cls(users=4).exp_name]
    assert failed["status"] == "FAILED" and failed["reason"] == "engine never became healthy"
    reasons = {name: df.loc[df["exp_name"].str.startswith(name), "reason"].iloc[0] for name in broken}
    statuses = {name: df.loc[df["exp_name"].str.startswith(name), "status"].iloc[0] for name in broken}
    assert set(statuses.values()) == {"MALFORMED"}
    assert reasons["badjson"].startswith("cell.json: not JSON")
    assert reasons["nostatus"] == "status.txt missing"
    assert reasons["badsummary"].startswith("summary.json: window")
    assert "window" in reasons["nowindow"]
    assert reasons["norequests"] == "requests.jsonl missing"
    assert "status.txt says FAILED but cell.json says SUCCESS" in reasons["mismatch"]
    assert reasons["binary"].startswith("summary.json")
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"collect: {len(broken) + 2} cells, 1 SUCCESS" in err
    assert (out / "summary.md").is_file() and "engine never became healthy" in (
        out / "summary.md"
    ).read_text()


def test_all_success_exits_0_and_duplicates_are_reported(tmp_path, cell_factory, spec_cls):
    root = tmp_path / "art"
    spec = spec_cls(users=2)
    cell_factory(root, spec)
    assert _collect(root, tmp_path / "o1", "--no-plots") == 0
    cell_factory(root / "again", spec)  # the same exp_name twice
    assert _collect(root, tmp_path / "o2", "--no-plots") == 1
    df = pd.read_csv(tmp_path / "o2" / "summary.csv")
    assert list(df["status"]) == ["SUCCESS", "MALFORMED"] and "duplicate exp_name" in df.loc[1, "reason"]


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert _collect(tmp_path / "nope", tmp_path / "out") == 2
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert _collect(tmp_path / "empty", tmp_path / "out") == 2
    bad = tmp_path / "m.json"
    bad.write_text("[1, 2]")
    assert _collect(tmp_path / "empty", tmp_path / "out", "--matrix", str(bad)) == 2
    assert "expected a list of cells" in capsys.readouterr().err


def test_missing_server_metrics_is_a_note_not_a_failure(tmp_path, cell_factory, spec_cls):
    cell_factory(tmp_path / "a", spec_cls(), server_metrics=False)
    row = to_frame(build_rows(find_cells(tmp_path / "a"))).iloc[0]
    assert row["status"] == "SUCCESS" and "server_metrics.csv missing" in row["notes"]
    assert math.isnan(row["gpu_hit_rate"])


def test_counter_reset_inside_the_window_gives_no_figure(tmp_path, cell_factory, spec_cls):
    path = cell_factory(tmp_path / "a", spec_cls())
    lines = (path / "server_metrics.csv").read_text().splitlines()
    head, rows = lines[0], lines[1:]
    cols = head.split(",")
    q = cols.index("prefix_cache_queries_total")
    mid = rows[40].split(",")  # 30 s into the window
    mid[q] = "1"  # the engine restarted: its counter started over
    rows[40] = ",".join(mid)
    (path / "server_metrics.csv").write_text("\n".join([head, *rows]) + "\n")
    row = to_frame(build_rows(find_cells(tmp_path / "a"))).iloc[0]
    assert math.isnan(row["gpu_hit_rate"]) and "went down" in row["notes"]


def test_log_histogram_quantiles_are_within_one_percent():
    hist = LogHistogram()
    values = [0.001 * 1.0007**i for i in range(20000)]
    for v in values:
        hist.add(v)
    for q in (0.5, 0.9, 0.99):
        exact = sorted(values)[int(q * (len(values) - 1))]
        assert hist.percentile(q * 100) == pytest.approx(exact, rel=0.011)
    assert LogHistogram().percentile(50) is None


def test_stream_requests_counts_phases(tmp_path):
    path = tmp_path / "requests.jsonl"
    recs = [
        {"phase": "warmup", "status": "ok", "ttft_s": 9.0, "theoretical_hit_blocks": 5, "total_blocks": 5},
        {
            "phase": "profile",
            "status": "ok",
            "ttft_s": 0.5,
            "prompt_tokens": 100,
            "cached_tokens": 40,
            "theoretical_hit_blocks": 3,
            "total_blocks": 4,
        },
        {  # accepted by the server, then cut: its blocks count in the reference
            "phase": "profile",
            "status": "error",
            "accepted": True,
            "ttft_s": None,
            "theoretical_hit_blocks": 1,
            "total_blocks": 4,
        },
        {  # refused before any prefill: its blocks never reached a cache
            "phase": "profile",
            "status": "error",
            "accepted": False,
            "ttft_s": None,
            "theoretical_hit_blocks": 2,
            "total_blocks": 4,
        },
        [1, 2],
    ]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n\nnot json\n")
    stats = stream_requests(path)
    assert (stats.records, stats.warmup, stats.profile_ok, stats.profile_errors, stats.bad_lines) == (
        4,
        1,
        1,
        2,
        2,
    )
    cols = stats.as_columns()
    assert cols["req_theoretical_hit_rate"] == pytest.approx(4 / 8)
    assert cols["req_client_hit_rate"] == pytest.approx(0.4)
    assert cols["req_ttft_p50_s"] == pytest.approx(0.5, rel=0.01)


def test_sped_up_simulated_cells_are_reported_in_engine_time(tmp_path, cell_factory, spec_cls):
    """speed S: wall latencies x S, wall rates / S, so a sim cell reads like the simulated hardware."""
    wall = spec_cls(tp=2, users=8, offload="on")
    fast = spec_cls(tp=2, users=8, offload="on", speed=20.0)
    cell_factory(tmp_path / "wall", wall)
    cell_factory(tmp_path / "fast", fast)
    a = to_frame(build_rows(find_cells(tmp_path / "wall"))).iloc[0]
    b = to_frame(build_rows(find_cells(tmp_path / "fast"))).iloc[0]
    assert (a["clock_scale"], b["clock_scale"]) == (1.0, 20.0)
    for col in ("ttft_p50_s", "tpot_p99_s", "e2e_p50_s", "req_ttft_p50_s"):
        assert b[col] == pytest.approx(a[col] * 20)
    for col in (
        "requests_per_s",
        "output_tok_per_s_per_gpu",
        "interactivity_p50_tok_per_s",
        "server_prompt_tok_per_s",
    ):
        assert b[col] == pytest.approx(a[col] / 20)
    # Ratios and counts do not depend on the clock.
    for col in ("gpu_hit_rate", "cpu_hit_rate", "preemptions", "requests_ok", "window_s"):
        assert b[col] == pytest.approx(a[col])


def test_cells_with_engine_timelines_report_the_engine_clock_and_keep_the_client_beside(
    tmp_path, cell_factory, spec_cls
):
    """summary.json engine_clock: latencies and throughput come from the engine's timelines; the
    client's (x speed) stay in client_* columns with the gap; a cell without one leaves them empty."""
    fast = spec_cls(tp=2, users=8, offload="on", speed=20.0)
    path = cell_factory(tmp_path / "fast", fast)
    summary = json.loads((path / "summary.json").read_text())
    engine_latency = {
        key: {stat: value * 0.8 * 20 for stat, value in dist.items()}
        for key, dist in summary["latency"].items()
        if key != "interactivity_tok_per_s"
    }
    engine_latency["interactivity_tok_per_s"] = summary["latency"]["interactivity_tok_per_s"]
    engine_tput = {key: value / 20 for key, value in summary["throughput"].items()}
    gap = {"ttft_p50": 0.25, "e2e_p50": 0.1, "e2e_share": 0.08}
    summary["engine_clock"] = {
        "speed": 20.0,
        "records": 10,
        "of": 10,
        "latency": engine_latency,
        "throughput": engine_tput,
        "gap": gap,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    cell_factory(tmp_path / "plain", fast)
    row = to_frame(build_rows(find_cells(tmp_path / "fast"))).iloc[0]
    plain = to_frame(build_rows(find_cells(tmp_path / "plain"))).iloc[0]
    assert row["latency_clock"] == "engine" and pd.isna(plain["latency_clock"])
    assert row["ttft_p50_s"] == pytest.approx(engine_latency["ttft_s"]["p50"])
    assert row["e2e_p99_s"] == pytest.approx(engine_latency["e2e_s"]["p99"])
    assert row["tpot_p50_s"] == pytest.approx(engine_latency["tpot_s"]["p50"])
    assert row["interactivity_p50_tok_per_s"] == pytest.approx(1 / engine_latency["tpot_s"]["p50"])
    assert row["output_tok_per_s"] == pytest.approx(engine_tput["output_tok_per_s"])
    # the client's figures, in the same (engine) units as before, beside them
    assert row["client_ttft_p50_s"] == pytest.approx(plain["ttft_p50_s"])
    assert row["client_e2e_p99_s"] == pytest.approx(plain["e2e_p99_s"])
    assert (row["client_gap_ttft_p50"], row["client_share_e2e"]) == (0.25, 0.08)
    assert pd.isna(plain["client_gap_ttft_p50"]) and pd.isna(plain["client_ttft_p50_s"])
