"""Each validity check on a small result directory: passes when healthy, fails with its reason when not."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from agentsweep.contract.cell import Cell
from agentsweep.metrics.dialects import COLUMNS
from agentsweep.validity import evaluate

CELL = Cell(
    exp_name="v-tp1-ep1-u2-off",
    engine="sim",
    model="m",
    tp=1,
    users=2,
    offload="off",
    duration=60,
    traces="t",
    max_delay=5.0,
)
WINDOW = 60.0


def healthy_records(n: int = 120) -> list[dict]:
    """Two lanes, one request every second each, streaming for 0.8 s, usage reported by the server."""
    out = []
    for i in range(n):
        t = i * 0.5
        out.append(
            {
                "user": i % 2,
                "phase": "profile",
                "status": "ok",
                "error": None,
                "t_dispatch": t,
                "t_done": t + 0.9,
                "ttft_s": 0.1,
                "output_tokens": 100,
                "prompt_tokens": 1000,
                "prompt_tokens_source": "server",
                "cached_tokens": 500,
            }
        )
    return out


def write_dir(
    path: Path,
    records: list[dict],
    *,
    counts: dict | None = None,
    audit: dict | None = None,
    server: dict | None = None,
    decreasing: str | None = None,
    window: dict | None = None,
    engine_clock: dict | None = None,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    ok = sum(r["status"] == "ok" for r in records)
    by_class: dict[str, int] = {}
    for r in records:
        if r["status"] != "ok":
            by_class[r["error"]["class"]] = by_class.get(r["error"]["class"], 0) + 1
    summary = {
        "schema_version": 1,
        "counts": counts
        or {"sent": len(records), "ok": ok, "failed": len(records) - ok, "failed_by_class": by_class},
        "window": window or {"start_unix": 1000.0, "end_unix": 1000.0 + WINDOW, "duration_s": WINDOW},
        "self_audit": {"dispatch_lag_s": {"p99": 0.002}, "client_cpu_share": 0.1, **(audit or {})},
    }
    if engine_clock is not None:
        summary["engine_clock"] = engine_clock
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    totals = {
        "requests_finished_total": ok,
        "prompt_tokens_total": sum(r["prompt_tokens"] for r in records if r["status"] == "ok"),
        "generation_tokens_total": 100 * ok,
        "prefix_cache_queries_total": 1000 * ok,
        "prefix_cache_hits_total": sum(r.get("cached_tokens") or 0 for r in records if r["status"] == "ok"),
        "kv_cache_usage": 0.5,
        **(server or {}),
    }
    with (path / "server_metrics.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for step, share in enumerate((0.0, 0.5, 1.0)):
            row = {"time_s": 1000.0 + step * 30}
            for name, value in totals.items():
                scaled = value * share if name.endswith("_total") else value
                if decreasing == name and step == 1:
                    scaled = value * 2
                row[name] = scaled
            writer.writerow([row.get(c, "") for c in COLUMNS])
    return path


def _reasons(path: Path, cell: Cell = CELL) -> dict[str, str]:
    validity = evaluate(path, cell)
    return {name: check.reason for name, check in validity.checks.items() if not check.ok}


def test_a_healthy_run_passes_every_check(tmp_path):
    validity = evaluate(write_dir(tmp_path, healthy_records()), CELL)
    assert validity.valid, validity.reasons
    expected = {
        "failed_share", "context_error_share", "window_coverage", "lanes_active", "throughput_drift",
        "dispatch_lag_p99", "client_cpu_share", "server_metrics", "request_count_gap",
        "prompt_token_gap", "cached_token_gap", "window_requests",
    }  # fmt: skip
    assert set(validity.checks) == expected
    as_json = validity.to_dict()
    assert as_json["valid"] is True and as_json["reasons"] == []
    assert as_json["checks"]["failed_share"] == {"value": 0.0, "limit": 0.02, "ok": True}


def _fail(records: list[dict], indices: range, cls: str) -> list[dict]:
    for i in indices:
        records[i] = {**records[i], "status": "error", "error": {"class": cls, "message": "x"}}
    return records


def test_failures_over_two_percent(tmp_path):
    reasons = _reasons(write_dir(tmp_path, _fail(healthy_records(), range(0, 6), "http_500")))
    assert (
        reasons["failed_share"] == "6 of 120 requests failed or were abandoned in flight (5.0%, limit 2.0%)"
    )
    fine = write_dir(tmp_path / "b", _fail(healthy_records(), range(0, 2), "http_500"))
    assert "failed_share" not in _reasons(fine)


def test_context_errors_over_one_percent(tmp_path):
    reasons = _reasons(write_dir(tmp_path, _fail(healthy_records(), range(0, 2), "context_length")))
    assert reasons["context_error_share"].startswith("2 of 120 requests exceeded the model's context length")


def test_a_window_without_tokens_is_not_covered(tmp_path):
    # Nothing dispatched in [20, 30): the request sent at 19.5 still streams into second 20.
    records = [r for r in healthy_records() if not 20 <= r["t_dispatch"] < 30]
    reasons = _reasons(write_dir(tmp_path, records))
    assert reasons["window_coverage"].startswith("9 of 60 window seconds saw no token arrive")


def test_a_stuck_lane(tmp_path):
    records = [r for r in healthy_records() if not (r["user"] == 1 and r["t_dispatch"] > 30)]
    reasons = _reasons(write_dir(tmp_path, records))
    assert reasons["lanes_active"].startswith("lane(s) 1 idle")
    # The entry's own limit: max_delay + 10 s by default, or max_lane_idle_s.
    assert "lanes_active" not in _reasons(
        write_dir(tmp_path / "b", records), CELL.replace(max_lane_idle_s=40)
    )


def test_a_lane_that_sent_nothing(tmp_path):
    records = [r for r in healthy_records() if r["user"] == 0]
    assert _reasons(write_dir(tmp_path, records))["lanes_active"] == "1 of 2 lanes sent nothing"


def test_throughput_drift_between_thirds(tmp_path):
    records = healthy_records()
    for r in records:
        if r["t_done"] > 40:
            r["output_tokens"] = 10  # the last third streams a tenth of the tokens
    reasons = _reasons(write_dir(tmp_path, records))
    assert "not a steady state" in reasons["throughput_drift"]


def test_the_drift_check_judges_the_steady_window_the_summary_chose(tmp_path):
    records = healthy_records()
    for r in records:
        if r["t_done"] < 15:
            r["output_tokens"] = 10  # a slow start, before the steady window
    whole = {"start_unix": 1000.0, "end_unix": 1000.0 + WINDOW, "duration_s": WINDOW}
    assert (
        "not a steady state"
        in _reasons(write_dir(tmp_path / "whole", records, window=whole))["throughput_drift"]
    )
    steady = {**whole, "start_unix": 1015.0, "duration_s": WINDOW - 15, "start_s": 15.0, "end_s": WINDOW}
    check = evaluate(write_dir(tmp_path / "steady", records, window=steady), CELL).checks["throughput_drift"]
    assert check.ok and check.value is not None and check.value < 0.1


def test_the_client_as_the_bottleneck(tmp_path):
    path = write_dir(
        tmp_path, healthy_records(), audit={"dispatch_lag_s": {"p99": 0.8}, "client_cpu_share": 0.97}
    )
    reasons = _reasons(path)
    assert reasons["dispatch_lag_p99"].startswith("the client dispatched 800 ms late at p99")
    assert reasons["client_cpu_share"].startswith("the client used 97% of a core")


@pytest.mark.parametrize(
    ("server", "check", "text"),
    [
        ({"requests_finished_total": 150}, "request_count_gap", "the server counted 150"),
        ({"prompt_tokens_total": 150_000}, "prompt_token_gap", "the server counted 150000"),
        ({"prefix_cache_hits_total": 10_000}, "cached_token_gap", "the server counted 10000"),
    ],
)
def test_client_and_server_disagree(tmp_path, server, check, text):
    reasons = _reasons(write_dir(tmp_path, healthy_records(), server=server))
    assert set(reasons) == {check} and text in reasons[check]


def test_requests_given_up_at_the_end_may_have_finished_on_the_server(tmp_path):
    """The client gave up 4 requests when its grace period ran out; the server finished 3 of them after
    it left: the counts agree. A server that counted more than the client's finished plus given-up
    requests still disagrees."""
    records = healthy_records()
    for r in records[-4:]:
        r.update(status="error", error={"class": "timeout", "message": "abandoned at the end of the run: x"})
    check = evaluate(write_dir(tmp_path / "a", records, server={"requests_finished_total": 119}), CELL)
    assert check.checks["request_count_gap"].ok and check.checks["request_count_gap"].value == 0.0
    far = _reasons(write_dir(tmp_path / "b", records, server={"requests_finished_total": 126}))
    assert far["request_count_gap"] == (
        "the client saw 116 requests finish (and gave up 4 at the end), the server counted 126"
    )


def test_server_metrics_missing_or_going_down(tmp_path):
    path = write_dir(tmp_path, healthy_records())
    (path / "server_metrics.csv").unlink()
    assert _reasons(path)["server_metrics"] == "server_metrics.csv missing"
    down = write_dir(tmp_path / "b", healthy_records(), decreasing="prompt_tokens_total")
    assert _reasons(down)["server_metrics"] == "counters went down: prompt_tokens_total"
    lines = (down / "server_metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    idx = header.index("requests_finished_total")
    blank = [",".join("" if i == idx else v for i, v in enumerate(line.split(","))) for line in lines[1:]]
    (tmp_path / "c").mkdir()
    write_dir(tmp_path / "c", healthy_records())
    (tmp_path / "c" / "server_metrics.csv").write_text("\n".join([lines[0], *blank]) + "\n")
    assert _reasons(tmp_path / "c")["server_metrics"] == "never scraped requests_finished_total"


def test_a_run_that_sent_nothing(tmp_path):
    path = write_dir(tmp_path, [], counts={"sent": 0, "ok": 0, "failed": 0})
    assert _reasons(path)["failed_share"] == "no request in the profiling window"


def test_too_few_requests_in_the_window_is_invalid(tmp_path):
    """A 1-second, 1-user cell finished 4 requests: its percentiles are noise, never a SUCCESS."""
    few = _reasons(write_dir(tmp_path / "few", healthy_records(), counts={"sent": 4, "ok": 4, "failed": 0}))
    assert few["window_requests"] == (
        "only 4 requests finished ok in the profiling window (limit 10): too few for its percentiles and "
        "rates; give the cell a longer duration or more users"
    )
    assert _reasons(write_dir(tmp_path / "enough", healthy_records())) == {}
    strict = CELL.replace(min_window_requests=200)
    assert list(_reasons(write_dir(tmp_path / "strict", healthy_records()), strict)) == ["window_requests"]


def test_the_client_clock_share_of_a_simulated_cell(tmp_path):
    """Judged only when the engine stated its own timelines; limit max_client_clock_share (50%)."""
    assert "client_clock_share" not in evaluate(write_dir(tmp_path / "real", healthy_records()), CELL).checks
    clock = {"speed": 50.0, "records": 120, "of": 120, "gap": {"ttft_p50": 0.3, "e2e_p50": 0.05}}
    ok = evaluate(
        write_dir(tmp_path / "ok", healthy_records(), engine_clock={**clock, "gap": {"e2e_share": 0.04}}),
        CELL,
    )
    assert ok.valid and ok.checks["client_clock_share"].value == 0.04
    assert ok.checks["client_clock_share"].limit == 0.5
    bad = write_dir(tmp_path / "bad", healthy_records(), engine_clock={**clock, "gap": {"e2e_share": 0.63}})
    assert _reasons(bad)["client_clock_share"].startswith(
        "the client and HTTP path took 63.0% of the requests'"
    )
    assert "client_clock_share" not in _reasons(bad, CELL.replace(max_client_clock_share=0.7))


def test_each_client_node_of_a_run_over_several_is_judged_alone(tmp_path):
    clients = {
        "0": {
            "node": "gpunode1",
            "client_cpu_share": 0.4,
            "dispatch_lag_p99_s": 0.002,
            "workers": 1,
            "requests": 60,
        },
        "1": {
            "node": "gpunode2",
            "client_cpu_share": 0.95,
            "dispatch_lag_p99_s": 0.4,
            "workers": 1,
            "requests": 60,
        },
    }
    path = write_dir(tmp_path, healthy_records(), audit={"clients": clients})
    validity = evaluate(path, CELL)
    assert validity.checks["client_cpu_share.client0"].ok and validity.checks["dispatch_lag_p99.client0"].ok
    reasons = _reasons(path)
    assert reasons["client_cpu_share.client1"].startswith("client 1 on gpunode2 used 95% of a core")
    assert reasons["dispatch_lag_p99.client1"].startswith("client 1 on gpunode2 dispatched 400 ms late")


def test_validity_is_its_checks_each_a_function_of_the_evidence_in_order(tmp_path):
    from agentsweep.validity.checks import CHECKS, client_limits
    from agentsweep.validity.evidence import load

    clients = {"0": {"node": "n0", "client_cpu_share": 0.95, "dispatch_lag_p99_s": 0.4}}
    path = write_dir(tmp_path, healthy_records(), audit={"clients": clients})
    evidence = load(path, CELL)
    names = [name for check in CHECKS for name in check(evidence)]
    assert list(evaluate(path, CELL).checks) == names and len(names) == len(set(names))
    # The per-client checks are the aggregate ones over the client's figures: the same limit, the
    # same verdict on the same value.
    checks = client_limits(evidence)
    assert checks["client_cpu_share.client0"].limit == checks["client_cpu_share"].limit
    assert not checks["client_cpu_share.client0"].ok and not checks["dispatch_lag_p99.client0"].ok
    one = write_dir(
        tmp_path / "one", healthy_records(), audit={"client_cpu_share": 0.95, "dispatch_lag_s": {"p99": 0.4}}
    )
    aggregate = client_limits(load(one, CELL))
    for name in ("client_cpu_share", "dispatch_lag_p99"):
        assert (aggregate[name].value, aggregate[name].ok) == (
            checks[f"{name}.client0"].value,
            checks[f"{name}.client0"].ok,
        )
