"""`kv-cache-tester synth` is bounded and signal-safe: stated limits (docs/traces.md), one-line
refusals, no silent clipping, and no file (temporary or final) left by SIGTERM or SIGINT."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kv_cache_tester.errors import UsageError
from kv_cache_tester.traces.loaders import MAX_TRACE_BYTES
from kv_cache_tester.traces.synth import MAX_SYNTH_COUNT, MAX_SYNTH_TOKENS, LengthSpec, synth_workload
from kv_cache_tester.traces.synth_cli import estimated_bytes


def _cmd(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "kv_cache_tester.cli", "synth", "--output", str(out), *args]


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (str(MAX_SYNTH_TOKENS + 1), f"at most {MAX_SYNTH_TOKENS} tokens"),
        (f"uniform:1:{MAX_SYNTH_TOKENS + 1}", f"at most {MAX_SYNTH_TOKENS} tokens"),
        (f"normal:{MAX_SYNTH_TOKENS * 2}:1", f"at most {MAX_SYNTH_TOKENS} tokens"),
        ("lognormal:1000:400", "SIGMA must be at most"),
    ],
)
def test_lengths_beyond_the_limit_are_refused_not_cut(spec: str, needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        LengthSpec.parse(spec, "--isl")


def test_a_wide_lognormal_never_overflows_and_its_clipped_draws_are_counted() -> None:
    spec = LengthSpec.parse("lognormal:1000:8", "--isl")
    clipped = [0]
    rng = random.Random(0)
    draws = [spec.draw(rng, clipped=clipped) for _ in range(2000)]
    assert max(draws) == MAX_SYNTH_TOKENS and min(draws) >= 1
    at_edges = sum(1 for d in draws if d in (1, MAX_SYNTH_TOKENS))
    assert 0 < sum(1 for d in draws if d == MAX_SYNTH_TOKENS) <= clipped[0] <= at_edges


def test_count_and_file_size_have_upper_bounds() -> None:
    spec = LengthSpec.parse("10", "--isl")
    with pytest.raises(UsageError, match=f"from 1 to {MAX_SYNTH_COUNT}"):
        next(synth_workload(spec, spec, MAX_SYNTH_COUNT + 1))
    big = LengthSpec.parse("100000", "--isl")
    assert estimated_bytes(big, 500_000, 64) > MAX_TRACE_BYTES > estimated_bytes(big, 1000, 64)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--count", str(MAX_SYNTH_COUNT + 1)], f"--count {MAX_SYNTH_COUNT + 1}: must be from 1 to"),
        (["--count", "500000", "--isl", "100000"], "a trace file may hold"),
        (["--isl", "20000000"], "the replayer's prompt limit"),
        (["--isl", "lognormal:1000:400"], "SIGMA"),
    ],
)
def test_bounds_are_one_line_and_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    if "--isl" not in args:
        args = [*args, "--isl", "10"]
    res = subprocess.run(_cmd(tmp_path / "x.jsonl", *args, "--osl", "5"), capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_clipped_draws_are_reported(tmp_path: Path) -> None:
    res = subprocess.run(
        _cmd(tmp_path / "x.jsonl", "--isl", "normal:5:100", "--osl", "5", "--count", "200"),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "input lengths drawn outside" in res.stdout and "were clipped" in res.stdout


@pytest.mark.integration
def test_output_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    res = subprocess.run(_cmd(fifo, "--isl", "10", "--osl", "5"), capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "not a regular file" in res.stderr, res.stderr


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_leaves_no_file_and_says_so(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "big.jsonl"
    proc = subprocess.Popen(
        _cmd(out, "--isl", "20000", "--osl", "5", "--count", "200000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not any(p.name.startswith(".big.jsonl.") for p in tmp_path.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    time.sleep(0.3)  # part of the file written
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary file
