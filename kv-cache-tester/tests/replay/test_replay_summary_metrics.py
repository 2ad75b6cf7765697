"""summary.json's metric block: the steady window's bounds, interactivity as 1 / full-response ITL,
the per-request speeds under their own name, and the stability block."""

from __future__ import annotations

import numpy as np
import pytest
from kv_cache_tester.replay import RunMeta, build_summary, write_records
from kv_cache_tester.stats import LogHistogram


def _record(user: int, dispatch: float, done: float, out: int, phase: str = "profile") -> dict:
    return {
        "trace_id": f"t{user}",
        "session_id": f"t{user}",
        "user": user,
        "turn": 0,
        "phase": phase,
        "request_id": None,
        "t_dispatch": dispatch,
        "t_done": done,
        "ttft_s": 0.2,
        "e2e_s": done - dispatch,
        "itl_s": {"mean": None, "p50": None, "p99": None, "max": None, "n": 0},
        "tpot_s": (done - dispatch - 0.2) / (out - 1),
        "prompt_tokens": 1000,
        "prompt_tokens_source": "server",
        "cached_tokens": 400,
        "expected_prompt_tokens": 1000,
        "output_tokens": out,
        "expected_output_tokens": out,
        "theoretical_hit_blocks": 1,
        "total_blocks": 2,
        "status": "ok",
        "error": None,
    }


def test_the_summary_holds_the_steady_window_interactivity_and_stability(tmp_path) -> None:
    # Four lanes; three join at 10 s (ramp-up), every lane stops dispatching at 40 s.
    records = []
    for user in range(4):
        t, i = (0.0 if user == 0 else 10.0), 0
        while t < 40.0:
            out = 11 + (i * 7 + user * 3) % 40
            records.append(_record(user, t, t + 1.0 + 0.01 * out, out))
            t += 1.5
            i += 1
    path = tmp_path / "requests.jsonl"
    write_records(path, records)
    meta = RunMeta(
        t0_unix=1000.0, stop_rel=40.0, end_rel=42.0, reason="duration", first_dispatch=[0.0, 10.0, 10.0, 10.0],
        abandoned=0, idle_lanes=0, cpu_s=1.0, wall_s=42.0, itl_hist=LogHistogram().to_dict(),
    )  # fmt: skip
    summary = build_summary(path, [meta], users=4, options={}, slo_ttft=None, slo_tpot=None)
    window = summary["window"]
    assert window["start_s"] == pytest.approx(10.0) and window["end_s"] == pytest.approx(40.0)
    assert window["span_start_unix"] == 1000.0 and window["start_unix"] == pytest.approx(1010.0)
    assert window["peak_in_flight"] > 3.0 and window["threshold_in_flight"] == window["peak_in_flight"] / 2
    assert window["duration_s"] == pytest.approx(30.0)
    inside = [r for r in records if 10.0 <= r["t_done"] <= 40.0]
    tokens = sum(r["prompt_tokens"] + r["output_tokens"] for r in inside)
    assert summary["throughput"]["total_tok_per_s"] == pytest.approx(tokens / 30.0)

    itls = [(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in records]
    latency = summary["latency"]
    assert latency["full_response_itl_s"]["p90"] == pytest.approx(np.percentile(itls, 90))
    assert latency["full_response_itl_s"]["std"] == pytest.approx(np.std(itls))
    assert latency["interactivity_tok_per_s"]["p90"] == pytest.approx(1 / np.percentile(itls, 90))
    assert latency["interactivity_tok_per_s"]["mean"] == pytest.approx(1 / np.mean(itls))
    speeds = [1 / i for i in itls]
    assert latency["output_speed_tok_per_s"]["p90"] == pytest.approx(np.percentile(speeds, 90))
    # p90 interactivity is the slow tail; the p90 of per-request speeds is the fast one.
    assert latency["interactivity_tok_per_s"]["p90"] < latency["output_speed_tok_per_s"]["p90"]
    assert latency["ttft_s"]["p75"] == pytest.approx(0.2)
    per_token = [r["e2e_s"] / r["output_tokens"] for r in records]
    assert latency["e2e_per_output_token_s"]["p90"] == pytest.approx(np.percentile(per_token, 90))
    assert latency["e2e_norm_interactivity_tok_per_s"]["p90"] == pytest.approx(
        1 / np.percentile(per_token, 90)
    )
    assert latency["e2e_norm_interactivity_tok_per_s"]["p90"] < latency["interactivity_tok_per_s"]["p90"]

    stability = summary["stability"]
    assert stability["subwindow_s"] == pytest.approx(10.0)
    assert stability["expected_window_count"] == 3 and stability["observed_window_count"] == 3
    assert stability["root_trajectory_count"] == 4
    shorter = build_summary(
        path, [meta], users=4, options={}, slo_ttft=None, slo_tpot=None, stability_subwindow_s=5.0
    )["stability"]
    assert shorter["subwindow_s"] == 5.0 and shorter["expected_window_count"] == 6
