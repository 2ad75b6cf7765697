"""hf:<org>/<dataset> from a prepared Hugging Face cache, and `kv-cache-tester analyze` outputs."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kv_cache_tester.cli import main
from kv_cache_tester.errors import TraceError
from kv_cache_tester.traces import load_traces
from kv_cache_tester.traces.analysis import corpus_stats, hit_summary, percentile, request_hits

pytest.importorskip("huggingface_hub")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _weka_rows() -> list[dict]:
    rows = []
    for k in range(3):
        ins = [130 + 70 * j for j in range(4)]
        reqs = [
            {"t": 5.0 * j, "type": "n", "in": n, "out": 3, "hash_ids": list(range(math.ceil(n / 64)))}
            for j, n in enumerate(ins)
        ]
        rows.append({"id": f"w{k}", "block_size": 64, "hash_id_scope": "local", "requests": reqs})
    return rows


def _prepare_cache(home: Path, repo: str) -> Path:
    """The real huggingface_hub cache layout: blobs/, refs/main, snapshots/<commit>/ with symlinks."""
    base = home / "hub" / f"datasets--{repo.replace('/', '--')}"
    (base / "blobs").mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(COMMIT)
    snap = base / "snapshots" / COMMIT / "data"
    snap.mkdir(parents=True)
    blob = base / "blobs" / "f00d"
    blob.write_text("".join(json.dumps(r) + "\n" for r in _weka_rows()))
    os.symlink(os.path.relpath(blob, snap), snap / "traces.jsonl")
    return base


def test_hf_dataset_from_offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _prepare_cache(tmp_path, "acme/cc-traces")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = load_traces("hf:acme/cc-traces")
    assert [t.trace_id for t in result.traces] == ["w0", "w1", "w2"]
    assert result.files == ["hf:acme/cc-traces/data/traces.jsonl"]
    assert result.dataset == "acme/cc-traces"
    assert result.traces[0].requests[3].hash_ids == list(range(6))


def test_hf_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TraceError, match=r"^hf:acme/absent: not in the Hugging Face cache"):
        load_traces("hf:acme/absent")
    with pytest.raises(TraceError, match=r"^hf:no-slash: expected hf:<org>/<dataset>$"):
        load_traces("hf:no-slash")


@pytest.mark.integration
def test_hf_through_cli_subprocess(tmp_path: Path) -> None:
    _prepare_cache(tmp_path, "acme/cc-traces")
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "kv_cache_tester.cli", "analyze", "hf:acme/cc-traces", "--no-plot"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "loaded 3 traces (12 requests)" in proc.stdout


SMALL = ("trace_0504", "trace_0058", "trace_0021", "trace_0291", "trace_0277", "trace_0292", "trace_0653")


@pytest.fixture
def small_dir(sample_traces: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "small"
    folder.mkdir()
    for name in SMALL:
        (folder / f"{name}.json").write_bytes((sample_traces / f"{name}.json").read_bytes())
    return folder


def test_request_hits_infinite_and_lru(small_dir: Path) -> None:
    traces = load_traces(small_dir).traces
    inf = request_hits(traces)
    # infinite cache: per trace, a request hits the longest prefix of ids seen before in its trace
    for trace in traces:
        seen: set[int] = set()
        recs = [r for r in inf if r.trace_id == trace.trace_id]
        ordered = sorted(trace.timeline(), key=lambda e: e[0])
        assert [r.t for r in recs] == [round(t, 6) for t, _, _ in ordered]
        for rec, (_, _, req) in zip(recs, ordered, strict=True):
            k = 0
            while k < len(req.hash_ids) and req.hash_ids[k] in seen:
                k += 1
            assert rec.inf_hit_blocks == k
            seen.update(req.hash_ids)
    big = request_hits(traces, cache_blocks=10**8)
    assert [r.lru_hit_blocks for r in big] == [r.inf_hit_blocks for r in inf]
    small = request_hits(traces, cache_blocks=2000)
    tiered = request_hits(traces, cache_blocks=2000, second_tier_blocks=20000)
    s_small, s_tier, s_inf = hit_summary(small), hit_summary(tiered), hit_summary(inf)
    assert s_small["lru_hit_rate"] < s_inf["infinite_hit_rate"]
    assert (
        s_small["lru_hit_rate"]
        < s_tier["lru_hit_rate"] + s_tier["lru_tier2_hit_rate"]
        <= s_inf["infinite_hit_rate"]
    )
    assert s_inf["lru_hit_rate"] is None


def test_corpus_stats_match_the_traces(sample_traces: Path) -> None:
    traces = load_traces(sample_traces).traces
    stats = corpus_stats(traces)
    isl = sorted(r.in_tokens for t in traces for r in t.all_requests())
    assert stats["counts"]["requests"] == len(isl) == 1514
    d = stats["distributions"]["isl"]
    assert (d["min"], d["max"], d["count"]) == (isl[0], isl[-1], len(isl))
    assert sum(d["histogram"]["counts"]) == len(isl)
    assert d["p50"] == percentile(isl, 50)
    fanout = [len(g.agents) for t in traces for g in t.groups]
    assert (
        stats["distributions"]["subagent_fanout"]["count"]
        == len(fanout)
        == stats["counts"]["subagent_groups"]
    )
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([], 50) is None


def test_analyze_writes_outputs(small_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = ["analyze", str(small_dir), "--cache-blocks", "2000", "--second-tier-blocks", "4000"]
    rc = main([*argv, "--max-context", "60000", "--output-dir", str(out)])
    printed = capsys.readouterr().out
    dropped = ["trace_0277", "trace_0291", "trace_0292", "trace_0653"]
    assert rc == 0
    assert f"max_context 60000 (drop): dropped 4 traces: {', '.join(dropped)}" in printed
    stats = json.loads((out / "trace_stats.json").read_text())
    assert stats["schema_version"] == 1
    assert stats["load_report"]["dropped_max_context"] == dropped
    assert stats["counts"]["traces"] == 3
    lines = (out / "request_hits.jsonl").read_text().splitlines()
    assert len(lines) == stats["counts"]["requests"] == stats["cache"]["requests"]
    first = json.loads(lines[0])
    assert {"trace_id", "session_id", "inf_hit_blocks", "lru_hit_blocks", "lru_tier2_hit_blocks"} <= set(
        first
    )
    png = out / "trace_stats.png"
    if importlib.util.find_spec("matplotlib") is None:  # the plots extra is not installed: no PNG
        assert not png.exists()
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
