"""The typed output files (RequestRecord, Summary), their readers, and the replay package's surface."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import kv_cache_tester.replay as replay
import pytest
from kv_cache_tester.replay import RequestRecord, ResultError, Summary, read_record, read_summary

PACKAGE = Path(replay.__file__).resolve().parent.parent


def _exact_keys(value: Any, td: Any, path: str = "") -> None:
    """``value`` holds every required key of TypedDict ``td`` and no key it does not declare, at
    every level."""
    hints = typing.get_type_hints(td)
    assert set(value) <= set(hints), f"{path or 'top'}: undeclared {sorted(set(value) - set(hints))}"
    missing = set(td.__required_keys__) - set(value)
    assert not missing, f"{path or 'top'}: missing {sorted(missing)}"
    for key, tp in hints.items():
        sub = value.get(key)
        for option in typing.get_args(tp) or (tp,):
            if typing.is_typeddict(option) and isinstance(sub, dict):
                _exact_keys(sub, option, f"{path}.{key}")


@pytest.mark.integration
def test_a_real_run_writes_exactly_the_declared_keys(tmp_path, stream_server, kit):
    server = stream_server()
    traces = kit.write_traces(tmp_path / "traces", [kit.linear_trace(f"tr{i}", 4) for i in range(2)])
    out = tmp_path / "out"
    res = kit.run_replay(server, traces, out, "--max-users", "2", "--time-scale", "0.01")
    assert res.returncode == 0, res.stderr
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 8
    for n, line in enumerate(lines, start=1):
        rec = read_record(json.loads(line), f"line {n}", required=RequestRecord.__required_keys__)
        _exact_keys(rec, RequestRecord)
        assert "client" not in rec and {"play", "salt", "dispatch_lag_s"} <= set(rec)
    summary = read_summary(json.loads((out / "summary.json").read_text()))
    _exact_keys(summary, Summary)
    assert summary["schema_version"] == replay.SCHEMA_VERSION == 1


def _summary() -> dict[str, Any]:
    dist = {"mean": 1.0, "p50": 1.0, "p90": 2.0, "p95": 2.0, "p99": 3.0, "p99.9": None}
    return {
        "schema_version": 1,
        "counts": {"sent": 3, "ok": 2, "failed": 1, "failed_by_class": {"http_500": 1}, "warmup": 0},
        "window": {"start_unix": 100.0, "end_unix": 160.0, "duration_s": 60.0},
        "throughput": {
            "requests_per_s": 0.1,
            "input_tok_per_s": 5,
            "output_tok_per_s": 1.0,
            "total_tok_per_s": 6,
        },
        "latency": {k: dict(dist) for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "interactivity_tok_per_s")},
    }


def test_read_summary_accepts_a_partial_summary_and_returns_it_unchanged():
    data = _summary()
    assert read_summary(data) is data  # keys an older writer left out are simply absent


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda s: s.update(schema_version=2), "summary.json: schema_version 2, expected 1"),
        (lambda s: s.pop("window"), "summary.json: window: missing"),
        (lambda s: s.update(counts=[]), "summary.json: counts: must be an object, got list"),
        (lambda s: s["window"].pop("end_unix"), "summary.json: window.end_unix: missing"),
        (
            lambda s: s["window"].update(start_unix=None),
            "summary.json: window.start_unix: must be a number, got None",
        ),
        (
            lambda s: s["window"].update(end_unix=float("nan")),
            "summary.json: window.end_unix: must be a finite number, got nan",
        ),
        (
            lambda s: s["window"].update(end_unix=99.0),
            "summary.json: window: end_unix 99.0 is before start_unix 100.0",
        ),
        (lambda s: s["counts"].update(sent=True), "summary.json: counts.sent: must be an integer, got True"),
        (
            lambda s: s["counts"]["failed_by_class"].update(http_500="1"),
            "summary.json: counts.failed_by_class.http_500: must be an integer, got '1'",
        ),
        (
            lambda s: s["latency"]["ttft_s"].update({"p99.9": "slow"}),
            "summary.json: latency.ttft_s.p99.9: must be a number or null, got 'slow'",
        ),
        (
            lambda s: s.update(cache={"client_hit_rate": [0.5]}),
            "summary.json: cache.client_hit_rate: must be a number or null, got list",
        ),
    ],
)
def test_read_summary_names_the_field(damage, message):
    data = _summary()
    damage(data)
    with pytest.raises(ResultError) as err:
        read_summary(data)
    assert str(err.value) == message
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"t_dispatch": 0.0}, "requests.jsonl: line 3: trace_id: missing"),
        (
            {"trace_id": "a", "t_dispatch": "soon"},
            "requests.jsonl: line 3: t_dispatch: must be a number, got 'soon'",
        ),
        (
            {"trace_id": "a", "t_dispatch": 0, "status": "fine"},
            "requests.jsonl: line 3: status: must be one of 'ok', 'error', got 'fine'",
        ),
        (
            {"trace_id": "a", "t_dispatch": 0, "error": {"class": 5, "message": "x"}},
            "requests.jsonl: line 3: error.class: must be a string, got 5",
        ),
        (
            {"trace_id": "a", "t_dispatch": 0, "itl_s": {"n": 1.5}},
            "requests.jsonl: line 3: itl_s.n: must be an integer, got 1.5",
        ),
        ([1, 2], "requests.jsonl: line 3: must be an object, got list"),
    ],
)
def test_read_record_names_the_field(record, message):
    with pytest.raises(ResultError) as err:
        read_record(record, "requests.jsonl: line 3")
    assert str(err.value) == message


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_replayer_package_stands_alone_and_has_no_import_circle():
    for path in PACKAGE.rglob("*.py"):
        assert not any(name.split(".")[0] == "agentsweep" for name in _imports(path)), path
    replay_dir = PACKAGE / "replay"
    assert "kv_cache_tester.replay.app" not in _imports(replay_dir / "workers.py")
    assert "kv_cache_tester.replay.app" not in _imports(replay_dir / "process.py")


@pytest.mark.integration
def test_the_public_surface_resolves_and_stays_light():
    for name in replay.__all__:
        assert getattr(replay, name) is not None, name
    code = (
        "import sys, kv_cache_tester.replay; print(sorted(m for m in sys.modules if m.startswith('aiohttp')))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"  # reading results needs no HTTP client
