"""AIPerf as a cell client: trace input, command, export conversion, and a real run against engine-sim."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentsweep.errors import InputError
from agentsweep.experimental.aiperf.cell import aiperf_command, profile_args, run_aiperf_cell
from agentsweep.experimental.aiperf.exports import convert_records, write_outputs
from agentsweep.experimental.aiperf.tokenizer import build_word_tokenizer
from agentsweep.experimental.aiperf.traces import prepare_input
from agentsweep.experimental.aiperf.venv import find_aiperf
from kv_cache_tester.replay import RequestRecord, read_record, read_summary
from kv_cache_tester.traces import load_traces

SMALL = ("trace_0504.json", "trace_0021.json", "trace_0291.json")  # 0291 has sub-agent groups


@pytest.fixture
def traces(tmp_path, sample_traces) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    for name in SMALL:
        shutil.copy(sample_traces / name, d / name)
    return d


def test_weka_input_round_trips_with_scaled_time(tmp_path, traces):
    prep = prepare_input(traces, tmp_path / "in", time_scale=0.5, max_delay=4.0)
    assert prep.dataset_type == "weka-trace" and prep.block_size == 64
    original = {t.trace_id: t for t in load_traces(traces).traces}
    written = {t.trace_id: t for t in load_traces(prep.path).traces}
    assert written.keys() == original.keys()
    for tid, t in original.items():
        w = written[tid]
        assert [r.hash_ids for r in w.all_requests()] == [r.hash_ids for r in t.all_requests()]
        assert [r.in_tokens for r in w.all_requests()] == [r.in_tokens for r in t.all_requests()]
        assert len(w.groups) == len(t.groups)
        for rw, ro in zip(w.requests, t.requests, strict=True):
            assert rw.t == pytest.approx(ro.t * 0.5, abs=1e-5)
            assert rw.think_time == pytest.approx(min(ro.think_time, 4.0) * 0.5, abs=1e-5)
        for gw, go in zip(w.groups, t.groups, strict=True):
            for aw, ao in zip(gw.agents, go.agents, strict=True):
                assert aw.t == pytest.approx(ao.t * 0.5, abs=1e-5)
    assert prep.requests == sum(t.num_requests for t in original.values())
    # every AIPerf conversation/turn maps back to one trace request
    sub = next(t for t in original.values() if t.groups)
    agent = sub.groups[0].agents[0]
    info = prep.lookup(f"{sub.trace_id}::sa:{agent.agent_id}", 1)
    assert info is not None and info.session_id == f"{sub.trace_id}:{agent.agent_id}"
    assert info.hash_ids == agent.requests[1].hash_ids


def test_mooncake_input_keeps_traces_apart(tmp_path, traces):
    prep = prepare_input(traces, tmp_path / "in", fmt="mooncake", time_scale=0.1, max_context=20000)
    rows = [json.loads(line) for line in prep.path.read_text().splitlines()]
    assert prep.dataset_type == "mooncake-trace" and len(rows) == prep.requests
    assert all(r["input_length"] <= 20000 for r in rows)
    first_ids = {}
    for r in rows:
        trace = r["session_id"].split("::sa:")[0]
        first_ids.setdefault(trace, set()).update(r["hash_ids"])
    sets = list(first_ids.values())
    assert all(not (a & b) for i, a in enumerate(sets) for b in sets[i + 1 :])  # local ids never collide
    later = [r for r in rows if "delay" in r]
    assert later and all(r["delay"] >= 0 for r in later)


def test_bad_trace_source_is_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        prepare_input(tmp_path / "nope", tmp_path / "in")


CELL = {
    "exp_name": "demo-tp1-ep1-u3-off",
    "engine": "sim",
    "hardware": "h200",
    "model": "m",
    "tp": 1,
    "users": 3,
    "offload": "off",
    "duration": 12,
    "traces": "x",
    "seed": 7,
    "warmup_requests": 2,
    "api": "chat",
    "ignore_eos": True,
    "client": "aiperf",
}


def test_profile_args_mirror_the_cell(tmp_path, traces):
    prep = prepare_input(traces, tmp_path / "in")
    argv = profile_args(
        CELL,
        aiperf="aiperf",
        endpoint="http://127.0.0.1:9",
        artifact_dir=tmp_path / "a",
        prepared=prep,
        tokenizer="/tok",
        metrics_url="http://127.0.0.1:9/metrics",
        word_tokenizer=True,
    )
    text = " ".join(argv)
    for part in (
        "--concurrency 3",
        "--benchmark-duration 12",
        "--warmup-request-count 6",
        "--random-seed 7",
        "--streaming",
        "--use-server-token-count",
        "--endpoint-type chat",
        "--custom-dataset-type weka-trace",
        "--use-think-time-only",
        "--server-metrics http://127.0.0.1:9/metrics",
        "--extra-inputs ignore_eos:true",
        "--tokenizer /tok",
    ):
        assert part in text
    cmd = aiperf_command(CELL, endpoint="http://h:1", output_dir=tmp_path)
    assert cmd[1:4] == ["-m", "agentsweep.experimental.aiperf", "run-cell"]
    assert json.loads(cmd[cmd.index("--cell") + 1])["users"] == 3


def test_word_tokenizer_counts_whitespace_words(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    corpus = tmp_path / "c.txt"
    corpus.write_text("To be, or not to be: that is the question.\nWhether 'tis nobler\n")
    out = build_word_tokenizer([corpus], tmp_path / "tok")
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = tok.encode("to be, or not").ids
    assert len(ids) == 4 and 0 not in ids  # every corpus word is known
    text = tok.decode(ids)
    assert text.split() == ["to", "be,", "or", "not"]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["clean_up_tokenization_spaces"] is False
    stamp = (out / "agentsweep-stamp.txt").read_text()
    build_word_tokenizer([corpus], out)  # reused: same corpus, same stamp
    assert (out / "agentsweep-stamp.txt").read_text() == stamp


def aiperf_record(conv: str, turn: int, start_ms: float, *, prompt=1000, cached=0, error=None) -> dict:
    start = int(1_700_000_000e9 + start_ms * 1e6)
    meta = {
        "conversation_id": conv,
        "turn_index": turn,
        "benchmark_phase": "profiling",
        "credit_issued_ns": int(1_700_000_000e9),
        "request_start_ns": start,
        "request_end_ns": start + 500_000_000,
        "x_request_id": f"r{conv}{turn}",
    }
    if error:
        return {"metadata": meta, "metrics": {}, "error": error}
    metrics = {
        "time_to_first_token": {"value": 120.0, "unit": "ms"},
        "request_latency": {"value": 500.0, "unit": "ms"},
        "inter_token_latency": {"value": 4.0, "unit": "ms"},
        "inter_chunk_latency": {"value": [4.0, 5.0, 3.0], "unit": "ms"},
        "usage_prompt_tokens": {"value": prompt, "unit": "tokens"},
        "usage_prompt_cache_read_tokens": {"value": cached, "unit": "tokens"},
        "usage_completion_tokens": {"value": 4, "unit": "tokens"},
    }
    return {"metadata": meta, "metrics": metrics}


def test_exports_become_our_records_and_summary(tmp_path, traces):
    prep = prepare_input(traces, tmp_path / "in")
    t = load_traces(traces / "trace_0021.json").traces[0]
    r0, r1 = t.requests[0], t.requests[1]
    records = [
        aiperf_record(t.trace_id, 1, 2000, prompt=r1.in_tokens, cached=600),
        aiperf_record(t.trace_id, 0, 1000, prompt=r0.in_tokens),
        aiperf_record(t.trace_id, 2, 3000, error={"code": 400, "type": "Bad Request", "message": "too long"}),
    ]
    lines, _t0, hist = convert_records(records, prep)
    assert [r["turn"] for r in lines] == [0, 1, 2]  # dispatch order
    first, second, failed = lines
    assert first["t_dispatch"] == pytest.approx(1.0) and first["ttft_s"] == pytest.approx(0.12)
    assert first["theoretical_hit_blocks"] == 0 and first["total_blocks"] == len(r0.hash_ids)
    common = 0
    while common < min(len(r0.hash_ids), len(r1.hash_ids)) and r0.hash_ids[common] == r1.hash_ids[common]:
        common += 1
    assert second["theoretical_hit_blocks"] == common > 0
    assert second["cached_tokens"] == 600 and second["expected_prompt_tokens"] == r1.in_tokens
    assert second["itl_s"]["n"] == 3 and second["client"] == "aiperf"
    assert failed["status"] == "error" and failed["error"]["class"] == "http_400"
    assert hist.n == 6

    art = tmp_path / "art"
    art.mkdir()
    (art / "profile_export.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = write_outputs(art, tmp_path / "out", prep, users=2, options={"client": "aiperf"})
    assert summary["client"] == "aiperf" and summary["counts"]["failed_by_class"] == {"http_400": 1}
    assert summary["cache"]["cached_tokens"] == 600
    assert summary["cache"]["client_hit_rate"] == pytest.approx(600 / (r0.in_tokens + r1.in_tokens))
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    assert len((tmp_path / "out" / "requests.jsonl").read_text().splitlines()) == 3
    # Both files are what the replayer's types say, every key of a record included.
    for n, line in enumerate((tmp_path / "out" / "requests.jsonl").read_text().splitlines(), start=1):
        read_record(json.loads(line), f"line {n}", required=RequestRecord.__required_keys__)
    assert read_summary(summary) == summary


@pytest.mark.integration
def test_convert_cli_rejects_non_aiperf_file(tmp_path):
    (tmp_path / "profile_export.jsonl").write_text('{"hello": 1}\n')
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentsweep.experimental.aiperf",
            "convert",
            str(tmp_path),
            "--output-dir",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "not an AIPerf record" in res.stderr


@pytest.fixture
def engine_sim(engine_sim_factory) -> Iterator[str]:
    with engine_sim_factory("--speed", "50") as url:
        yield url


@pytest.mark.slow
def test_aiperf_cell_against_engine_sim(tmp_path, traces, engine_sim):
    if find_aiperf() is None:
        pytest.skip("aiperf is not installed: run experimental/aiperf/setup_venv.sh")
    cell = {**CELL, "model": "sim-model", "users": 2, "duration": 6, "traces": str(traces), "speed": 50.0}
    cell["warmup_requests"] = 1
    rc = run_aiperf_cell(cell, engine_sim, tmp_path / "cell", install=False)
    assert rc == 0, (tmp_path / "cell" / "aiperf.log").read_text()[-2000:]
    recs = [json.loads(line) for line in (tmp_path / "cell" / "requests.jsonl").read_text().splitlines()]
    ok = [r for r in recs if r["status"] == "ok"]
    assert ok and all(r["client"] == "aiperf" for r in recs)
    assert {r["phase"] for r in recs} >= {"warmup", "profile"}
    # the word-level tokenizer makes AIPerf's prompts as long as the trace says (plus chat template)
    assert all(r["prompt_tokens_source"] == "server" and r["expected_prompt_tokens"] for r in ok)
    assert all(0 <= r["prompt_tokens"] - r["expected_prompt_tokens"] < 200 for r in ok)
    summary = json.loads((tmp_path / "cell" / "summary.json").read_text())
    assert summary["client"] == "aiperf" and summary["counts"]["ok"] == sum(
        r["phase"] == "profile" for r in ok
    )
    assert summary["cache"]["theoretical_hit_rate"] > 0.3
    assert summary["cache"]["client_hit_rate"] > 0.3  # the engine's cache really served AIPerf's prefixes
    assert (tmp_path / "cell" / "aiperf" / "profile_export.jsonl").is_file()
    from agentsweep.experimental.flamegraphs import render

    index, pngs = render(tmp_path / "cell" / "requests.jsonl", tmp_path / "cell" / "flamegraphs")
    assert pngs and index.is_file()
