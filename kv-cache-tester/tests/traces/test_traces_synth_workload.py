"""`kv-cache-tester synth`: fixed-length synthetic workloads written as ordinary trace files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kv_cache_tester.errors import UsageError
from kv_cache_tester.traces import load_traces
from kv_cache_tester.traces.analysis import hit_summary, request_hits
from kv_cache_tester.traces.synth import LengthSpec, synth_workload


def _synth(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kv_cache_tester.cli", "synth", "--output", str(tmp_path / name), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["w.jsonl", "w.json"])
def test_fixed_lengths_load_as_traces_with_no_reuse(tmp_path: Path, name: str) -> None:
    res = _synth(tmp_path, name, "--isl", "1000", "--osl", "37", "--count", "50", "--block-size", "16")
    assert res.returncode == 0, res.stderr
    loaded = load_traces(tmp_path / name)
    assert len(loaded.traces) == 50 and len({t.trace_id for t in loaded.traces}) == 50
    for trace in loaded.traces:
        (req,) = trace.requests
        assert (req.in_tokens, req.out_tokens, req.think_time) == (1000, 37, 0.0)
        assert len(req.hash_ids) == -(-1000 // 16)  # every token, the tail too, is in a named block
    # random prompts: no request can hit another's blocks
    hits = hit_summary(request_hits(loaded.traces))
    assert hits["infinite_hit_rate"] == 0.0


@pytest.mark.integration
def test_shared_prefix_is_shared_by_every_request_and_nothing_else(tmp_path: Path) -> None:
    res = _synth(
        tmp_path, "s.jsonl", "--isl", "2048", "--osl", "8", "--count", "20", "--shared-prefix", "1000"
    )
    assert res.returncode == 0, res.stderr
    assert "rounded down" in res.stdout and "shared prefix 960 tokens" in res.stdout
    traces = load_traces(tmp_path / "s.jsonl").traces
    recs = request_hits(traces)
    # 960 tokens = 15 blocks of 64 shared; the first request computes them, the other 19 hit them
    assert [r.inf_hit_blocks for r in recs] == [0] + [15] * 19
    private = [h for t in traces for h in t.requests[0].hash_ids[15:]]
    assert len(private) == len(set(private)) == 20 * (32 - 15)


@pytest.mark.integration
def test_same_seed_same_file_and_distributions_stay_in_range(tmp_path: Path) -> None:
    args = ["--isl", "uniform:800:1200", "--osl", "normal:500:100", "--count", "400", "--seed", "7"]
    assert _synth(tmp_path, "a.jsonl", *args).returncode == 0
    assert _synth(tmp_path, "b.jsonl", *args).returncode == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    args[-1] = "8"
    assert _synth(tmp_path, "c.jsonl", *args).returncode == 0
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()
    reqs = [t.requests[0] for t in load_traces(tmp_path / "a.jsonl").traces]
    ins = [r.in_tokens for r in reqs]
    outs = [r.out_tokens for r in reqs]
    assert min(ins) >= 800 and max(ins) <= 1200 and len(set(ins)) > 100
    assert 470 < sum(outs) / len(outs) < 530 and min(outs) >= 1


def test_lognormal_median_and_fixed_draws() -> None:
    import random

    rng = random.Random(1)
    spec = LengthSpec.parse("lognormal:1000:0.5", "--isl")
    draws = sorted(spec.draw(rng) for _ in range(2001))
    assert 930 < draws[1000] < 1070
    assert LengthSpec.parse("64", "--isl").draw(rng) == 64


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--isl", "abc", "--osl", "5"], "--isl 'abc'"),
        (["--isl", "uniform:9:3", "--osl", "5"], "LO <= HI"),
        (["--isl", "10", "--osl", "0"], "positive integer"),
        (["--isl", "10", "--osl", "normal:5"], "--osl 'normal:5'"),
        (["--isl", "10", "--osl", "5", "--count", "0"], "--count 0"),
        (["--isl", "10", "--osl", "nan"], "finite"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    res = _synth(tmp_path, "x.jsonl", *args)
    assert res.returncode == 2
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.integration
def test_bad_output_name(tmp_path: Path) -> None:
    res = _synth(tmp_path, "x.txt", "--isl", "10", "--osl", "5")
    assert res.returncode == 2 and "--output" in res.stderr


def test_prefix_longer_than_prompt_is_refused() -> None:
    spec = LengthSpec.parse("100", "--isl")
    with pytest.raises(UsageError, match="--shared-prefix"):
        list(synth_workload(spec, spec, 3, shared_prefix=128, block_size=64))
