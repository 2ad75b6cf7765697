"""The store's reads of a result directory, each through the file's owner: one pass over the records
feeds collect's figures and the drill-down alike, summary.json and router.json are read once (by
collect), a FAILED cell's records are read all the same, a broken router.json (or a capacity.json
beside an ordinary cell) leaves a note, and the stability block is read in one place."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from agentsweep.collect.aggregate import load_cell
from agentsweep.collect.discover import FoundCell
from agentsweep.errors import InputError
from agentsweep.store import result_files
from agentsweep.store.result_files import drilldown, kept_files, read_point, read_stability

from ..collect.conftest import Spec, requests_lines, write_cell
from ..collect.routed_cells import count_router_reads, pd_cell, routed_cell


def _records(path: Path) -> list[dict]:
    """The lines of requests.jsonl that are JSON."""
    out = []
    for line in (path / "requests.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_one_pass_gives_collects_figures_and_every_requests_timeline(tmp_path):
    path = write_cell(tmp_path, Spec(users=4))
    with (path / "requests.jsonl").open("a") as fh:
        fh.write("{not json\n")  # a bad line: counted by the owner's reader, in neither
        fh.write(json.dumps({"trace_id": "x", "t_done": 9.0}) + "\n")  # no dispatch time: no bar
    facts = read_point(path)
    row = load_cell(FoundCell(path, facts.exp_name))
    assert facts.metrics["req_records"] == row.figures["req_records"] == len(_records(path)) == 41
    records = [r for r in _records(path) if "t_dispatch" in r]
    timeline = facts.requests
    assert list(timeline.t) == [r["t_dispatch"] for r in records]
    assert [None if math.isnan(v) else v for v in timeline.ttft] == [r["ttft_s"] for r in records]
    assert list(timeline.lane) == [r["user"] for r in records]
    assert list(timeline.flags) == [
        (r["status"] == "ok") | (2 if r["phase"] == "warmup" else 0) for r in records
    ]
    assert [v for v in timeline.itl] == [r["itl_s"]["p50"] for r in records]  # the median, no mean kept
    payload = drilldown(facts)
    assert payload["requests"]["total"] == len(records)
    assert payload["requests"]["ttft"] == [
        None if r["ttft_s"] is None else round(r["ttft_s"], 5) for r in records
    ]


def test_a_failed_cells_records_are_read_by_the_owner_too(tmp_path):
    spec = Spec(users=2)
    path = write_cell(tmp_path, spec, status="FAILED", reason="engine exited with status 1")
    lines = requests_lines(spec, n=7)
    (path / "requests.jsonl").write_text("\n".join(lines) + "\n" + '{"trace_id": "t0", "t_disp')  # torn tail
    facts = read_point(path)
    assert facts.status == "FAILED" and "req_records" not in facts.metrics
    assert len(facts.requests) == 7 and list(facts.requests.t) == [float(i) for i in range(7)]
    (path / "requests.jsonl").unlink()
    (path / "requests.jsonl").mkdir()  # not a file: one line naming it, never a traceback
    with pytest.raises(InputError, match=r"requests\.jsonl: not a regular file \(a directory\)"):
        read_point(path)


def test_a_broken_router_json_leaves_a_note_in_the_drilldown(tmp_path):
    path = routed_cell(tmp_path, Spec(tp=1, users=8, offload="on"))
    for line_no, rec in enumerate(_records(path)):
        assert "t_dispatch" in rec, line_no
    facts = read_point(path)
    assert drilldown(facts)["router"]["totals"]["requests_by_replica"] == [30.0, 10.0]
    (path / "router.json").write_text(json.dumps({"requests_by_replica": [-1]}))
    facts = read_point(path)
    payload = drilldown(facts)
    assert (payload["router"] or {}).get("totals") is None
    assert facts.router is None and facts.router_error is not None
    assert f"drill-down: {facts.router_error}" in payload["notes"]
    assert any(n.startswith("drill-down: router.json: requests_by_replica") for n in payload["notes"])
    # The point itself is INVALID for it, with collect's reason (it was read the once).
    assert facts.status == "INVALID" and facts.reason == f"collect: {facts.router_error}"


def test_router_json_is_read_once_by_collect_and_drawn_from_its_result(tmp_path, monkeypatch):
    """The drill-down's router totals are router.json as collect's CellResult holds it, read once."""
    path = pd_cell(tmp_path, Spec(tp=1, users=8, offload="off"), prefill=(2, 1))
    reads = count_router_reads(monkeypatch)
    facts = read_point(path)
    payload = drilldown(facts)
    assert reads == [path]
    assert facts.router is not None and facts.router_error is None
    assert payload["router"]["totals"] == {
        "requests_by_prefill": [40.0, 40.0],
        "requests_by_decode": [25.0, 15.0],
    }
    assert not any("router.json" in n for n in payload["notes"])


def test_kept_files_are_the_declared_ones(tmp_path):
    path = routed_cell(tmp_path, Spec(tp=1, users=8, offload="on"))
    (path / "server.log").write_text("engine\n")
    (path / "notes.txt").write_text("not a result file\n")
    names = sorted(p.name for p in path.iterdir())
    kept = kept_files(path, names)
    assert "requests.jsonl" in kept and "router.json" in kept and "server_metrics.r0.csv" in kept
    assert "server.log" not in kept and "notes.txt" not in kept and "status.txt" not in kept


def test_the_stability_block_is_read_in_one_place():
    summary = {
        "stability": {
            "observed_window_count": 3,
            "observed_window_p90_ttft_min": 0.5,
            "observed_window_p90_ttft_max": 0.8,
            "observed_window_p75_intvty_min": 40.0,
            "observed_window_p75_intvty_max": 50.0,
            "observed_window_p90_e2el_min": 2.0,  # no max: no range
            "observed_window_p90_e2el_max": "n/a",
        }
    }
    block, ranges = read_stability(summary, clock_scale=10.0)  # type: ignore[arg-type]
    assert block == summary["stability"]
    # In the engine's clock: latencies x 10, interactivity / 10.
    assert ranges == {"ttft_p90_s": (5.0, 8.0), "interactivity_p75_tok_per_s": (4.0, 5.0)}
    assert read_stability(None, 1.0) == ({}, {})
    assert read_stability({"stability": [1, 2]}, 1.0) == ({}, {})  # type: ignore[arg-type]
    assert set(result_files.STABILITY_METRICS) == {"ttft", "e2el", "intvty"}


def test_summary_json_is_read_once_by_collect(tmp_path, monkeypatch):
    path = write_cell(tmp_path, Spec(users=4))

    def read_again(*args, **kwargs):
        raise AssertionError("summary.json read a second time")

    monkeypatch.setattr("agentsweep.capacity.measure.load_summary", read_again)
    facts = read_point(path)
    assert facts.validity and facts.slo_run["output"] is not None


def test_a_capacity_json_beside_an_ordinary_cell_is_noted_in_the_drilldown(tmp_path):
    path = write_cell(tmp_path, Spec(users=4))
    (path / "capacity.json").write_text(json.dumps({"x": 1}))
    payload = drilldown(read_point(path))
    assert payload["capacity"] is None
    assert any(n.startswith("drill-down: capacity.json: ") for n in payload["notes"])
