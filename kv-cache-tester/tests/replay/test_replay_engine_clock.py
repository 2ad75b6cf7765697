"""The engine's own timeline (``sim_timeline``): kept from the stream, written into the record, and
summarized in the engine's clock beside the client's figures (no socket: a scripted stream)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kv_cache_tester.replay.client import Outcome, StreamTimer, engine_times
from kv_cache_tester.replay.results import RequestRecord, read_records, write_records
from kv_cache_tester.replay.summary import RunMeta, build_summary
from kv_cache_tester.stats import LogHistogram

USAGE = {"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 64}}
DONE = b"data: [DONE]\n\n"


def chunk(content: str | None = None, usage: dict | None = None) -> bytes:
    obj: dict = {"choices": [{"index": 0, "delta": {"content": content}}] if content else []}
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def run_send(status: int, reads: list[bytes]) -> tuple[Outcome, None]:
    """The reads through a response's SSE reader, one every 10 ms."""
    assert status == 200
    timer = StreamTimer(100.0)
    for i, data in enumerate(reads, start=1):
        if not timer.feed(data, 100.0 + 0.01 * i):
            break
    return timer.finish(), None


TIMELINE = {
    "arrival_s": 10.0,
    "first_token_s": 10.25,
    "finish_s": 10.45,
    "ttft_s": 0.25,
    "e2e_s": 0.45,
    "tpot_s": 0.1,
    "itl_s": {"mean": 0.1, "p50": 0.1, "p99": 0.1, "max": 0.1, "n": 2},
    "output_tokens": 3,
    "prefill_s": 0.0,
    "transfer_s": 0.0,
    "preemptions": 0,
    "speed": 20.0,
    "clock_start_unix": 1.7e9,
}


def stamped(content: str, timeline: object) -> bytes:
    obj = {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": "length"}]}
    return b"data: " + json.dumps({**obj, "sim_timeline": timeline}).encode() + b"\n\n"


def test_the_last_chunk_timeline_is_kept_and_changes_no_client_figure():
    plain, _ = run_send(200, [chunk("a"), chunk("b"), chunk("c"), chunk(usage=USAGE), DONE])
    out, _ = run_send(200, [chunk("a"), chunk("b"), stamped("c", TIMELINE), chunk(usage=USAGE), DONE])
    assert out.ok and plain.ok and plain.engine is None
    assert (out.ttft, out.e2e, out.itls, out.output_tokens) == (plain.ttft, plain.e2e, plain.itls, 3)
    assert out.engine == {
        "ttft_s": 0.25,
        "e2e_s": 0.45,
        "tpot_s": 0.1,
        "itl_s": {"mean": 0.1, "p50": 0.1, "p99": 0.1, "max": 0.1, "n": 2},
        "output_tokens": 3,
        "speed": 20.0,
    }


@pytest.mark.parametrize(
    ("timeline", "says"),
    [
        ([1, 2], "sim_timeline: must be a JSON object"),
        ({**TIMELINE, "ttft_s": "soon"}, "sim_timeline: ttft_s must be a finite number"),
        ({**TIMELINE, "e2e_s": None}, "sim_timeline: e2e_s must be a finite number"),
        ({**TIMELINE, "speed": 0}, "sim_timeline: speed must be > 0"),
        ({**TIMELINE, "itl_s": 3}, "sim_timeline: itl_s must be a JSON object"),
        ({**TIMELINE, "output_tokens": 2.5}, "sim_timeline: output_tokens must be an integer"),
        ({**TIMELINE, "tpot_s": -1.0}, "sim_timeline: tpot_s must be a finite number >= 0"),
    ],
)
def test_a_timeline_that_is_not_one_is_a_protocol_error(timeline: object, says: str):
    out, _ = run_send(200, [chunk("a"), stamped("b", timeline), DONE])
    assert not out.ok and out.error_class == "protocol"
    assert out.error_message is not None and out.error_message.startswith(says)


def test_engine_times_takes_only_what_the_record_keeps():
    times = engine_times(TIMELINE)
    assert set(times) == {"ttft_s", "e2e_s", "tpot_s", "itl_s", "output_tokens", "speed"}
    assert engine_times({**TIMELINE, "ttft_s": None, "tpot_s": None})["ttft_s"] is None


def _record(i: int, client_ttft: float, client_e2e: float, engine: dict | None) -> RequestRecord:
    record: RequestRecord = {
        "trace_id": f"t{i}",
        "session_id": f"t{i}",
        "user": i,
        "turn": 0,
        "phase": "profile",
        "request_id": f"t{i}#0",
        "t_dispatch": 0.1 * i,
        "t_done": 0.1 * i + client_e2e,
        "ttft_s": client_ttft,
        "e2e_s": client_e2e,
        "itl_s": {"mean": 0.005, "p50": 0.005, "p99": 0.005, "max": 0.005, "n": 2},
        "tpot_s": (client_e2e - client_ttft) / 2,
        "prompt_tokens": 1000,
        "prompt_tokens_source": "server",
        "cached_tokens": 0,
        "expected_prompt_tokens": 1000,
        "output_tokens": 3,
        "expected_output_tokens": 3,
        "theoretical_hit_blocks": 0,
        "total_blocks": 62,
        "status": "ok",
        "error": None,
    }
    if engine is not None:
        record["engine"] = engine_times(engine)
    return record


def _summary(tmp_path: Path, records: list[RequestRecord]):
    path = tmp_path / "requests.jsonl"
    write_records(path, records)
    meta = RunMeta(
        t0_unix=1.7e9,
        stop_rel=10.0,
        end_rel=10.0,
        reason="duration",
        first_dispatch=[0.0],
        abandoned=0,
        idle_lanes=0,
        cpu_s=1.0,
        wall_s=10.0,
        itl_hist=LogHistogram().to_dict(),
    )
    return build_summary(path, [meta], users=4, options={}, slo_ttft=None, slo_tpot=None)


def test_the_summary_states_the_engine_clock_and_the_gap_to_the_client(tmp_path: Path):
    # Four requests; the client saw each 2 ms (TTFT) and 4 ms (E2E) of wall time later than the
    # engine's timeline over 20 (its speed-up): 40 and 80 engine milliseconds.
    records = []
    for i, ttft in enumerate((0.20, 0.25, 0.30, 0.35)):
        e2e = ttft + 0.2
        tl = {**TIMELINE, "ttft_s": ttft, "e2e_s": e2e, "tpot_s": 0.1}
        records.append(_record(i, (ttft + 0.04) / 20, (e2e + 0.08) / 20, tl))
    summary = _summary(tmp_path, records)
    clock = summary["engine_clock"]
    assert (clock["speed"], clock["records"], clock["of"]) == (20.0, 4, 4)
    assert clock["latency"]["ttft_s"]["p50"] == pytest.approx(0.275)
    assert clock["latency"]["e2e_s"]["p50"] == pytest.approx(0.475)
    assert clock["latency"]["tpot_s"]["p50"] == pytest.approx(0.1)
    assert clock["latency"]["itl_s"]["p50"] == pytest.approx(0.1, rel=0.01)  # a log bucket's middle
    assert clock["latency"]["interactivity_tok_per_s"]["p50"] == pytest.approx(10.0)
    # E2E per output token from the engine's E2E and its token count (0.40 ... 0.55 s over 3 tokens)
    per_token = sorted((ttft + 0.2) / TIMELINE["output_tokens"] for ttft in (0.20, 0.25, 0.30, 0.35))
    p90 = per_token[2] + 0.7 * (per_token[3] - per_token[2])
    assert clock["latency"]["e2e_norm_interactivity_tok_per_s"]["p90"] == pytest.approx(1 / p90)
    # the client's own figures are unchanged (wall clock)
    assert summary["latency"]["ttft_s"]["p50"] == pytest.approx(0.315 / 20)
    gap = clock["gap"]
    assert gap["ttft_p50"] == pytest.approx(0.315 / 0.275 - 1)
    assert gap["e2e_p50"] == pytest.approx(0.555 / 0.475 - 1)
    assert gap["e2e_share"] == pytest.approx(0.32 / (4 * 0.475 + 0.32))
    # throughput over the (steady) window in engine seconds: its wall length x 20
    window_s = summary["window"]["duration_s"]
    assert 0 < window_s <= 10
    assert clock["throughput"]["requests_per_s"] == pytest.approx(4 / (window_s * 20))
    assert summary["throughput"]["requests_per_s"] == pytest.approx(4 / window_s)
    # and the records read back with the timeline
    back = read_records(tmp_path / "requests.jsonl")
    assert back[0].get("engine") == records[0]["engine"]


def test_records_without_timelines_leave_no_engine_clock(tmp_path: Path):
    summary = _summary(tmp_path, [_record(i, 0.01, 0.02, None) for i in range(3)])
    assert "engine_clock" not in summary
