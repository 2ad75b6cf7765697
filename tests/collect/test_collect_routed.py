"""Routed cells in summary.csv: shape columns, router figures, per-instance spread, bad artifacts."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.collect.aggregate import build_rows, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.contract.cellresult import load_cell_result

from ..store.conftest import seal
from .conftest import HIT, Spec, summary_json
from .routed_cells import HITS, count_router_reads, pd_cell, routed_cell


def _row(root: Path) -> pd.Series:
    frame = to_frame(build_rows(find_cells(root)))
    assert len(frame) == 1
    return frame.iloc[0]


def _text(value: object) -> str:
    return "" if pd.isna(value) else str(value)


def test_a_replicated_cell_gets_its_shape_router_figures_and_replica_spread(tmp_path):
    spec = Spec(tp=2, users=8, offload="off")
    routed_cell(tmp_path, spec, hits=(0.5, 0.7), counts=(30.0, 10.0))
    row = _row(tmp_path)
    assert row["status"] == "SUCCESS", row["reason"]
    assert (row["replicas"], row["router"], row["router_program"], row["nodes"]) == (
        2,
        "cache_aware",
        "smg",
        1,
    )
    assert _text(row["disagg"]) == ""
    assert row["router_busiest_share"] == pytest.approx(30 / 40)
    assert row["router_prefix_match"] == pytest.approx(0.83)
    assert row["router_affinity_share"] == pytest.approx(36 / 40)  # tree_match of all placements
    assert row["replica_gpu_hit_min"] == pytest.approx(0.5)
    assert row["replica_gpu_hit_max"] == pytest.approx(0.7)
    # The merged rate weighs each replica by its queries (replica 1 has twice replica 0's).
    assert row["gpu_hit_rate"] == pytest.approx((0.5 * 1 + 0.7 * 2) / 3)
    assert pd.isna(row["prefill_gpu_hit_rate"])
    # Per GPU = over every GPU of the cell: 2 replicas x TP 2.
    out = summary_json(spec)["throughput"]["output_tok_per_s"]
    assert row["gpus"] == 4
    assert row["output_tok_per_s_per_gpu"] == pytest.approx(out / 4)


@pytest.mark.parametrize("gpus_field", [False, True])
def test_a_disaggregated_cell_divides_by_both_roles_gpus(tmp_path, gpus_field):
    spec = Spec(tp=2, users=8, offload="off")
    pd_cell(tmp_path, spec, prefill=(2, 4), decode_hits=(0.2, 0.3), prefill_hit=0.8, gpus_field=gpus_field)
    row = _row(tmp_path)
    assert row["status"] == "SUCCESS", row["reason"]
    assert row["disagg"] == "p2x4-d2x2"
    assert row["gpus"] == 2 * 4 + 2 * 2
    summary = summary_json(spec)["throughput"]
    for key in ("output_tok_per_s", "input_tok_per_s", "total_tok_per_s"):
        assert row[f"{key}_per_gpu"] == pytest.approx(summary[key] / 12), key
    # gpu_hit_rate is the decode instances' (server_metrics.csv); the prefill rate is its own column.
    assert row["gpu_hit_rate"] == pytest.approx((0.2 * 1 + 0.3 * 2) / 3)
    assert row["prefill_gpu_hit_rate"] == pytest.approx(0.8)
    assert (row["replica_gpu_hit_min"], row["replica_gpu_hit_max"]) == pytest.approx((0.2, 0.3))
    # Two prefill instances at 40 each, decode 25 / 15: the decode role shows the imbalance.
    assert row["router_busiest_share"] == pytest.approx(25 / 40)
    assert pd.isna(row["router_prefix_match"]) and pd.isna(row["router_affinity_share"])


@pytest.mark.parametrize(
    ("decode_hits", "label", "busiest"), [((0.4,), "p1x1-d1x1", 1.0), ((0.4, 0.5), "p1x1-d2x1", 25 / 40)]
)
def test_a_role_of_one_instance_does_not_decide_the_busiest_share(tmp_path, decode_hits, label, busiest):
    """One prefill instance takes every request; the balance of the decode role is what the share shows."""
    pd_cell(tmp_path, Spec(tp=1), prefill=(1, 1), decode_hits=decode_hits)
    row = _row(tmp_path)
    assert row["status"] == "SUCCESS", row["reason"]
    assert row["disagg"] == label and row["gpus"] == 1 + len(decode_hits)
    assert row["router_busiest_share"] == pytest.approx(busiest)


def test_a_single_engine_cell_has_no_routed_figures(tmp_path, cell_factory):
    cell_factory(tmp_path, Spec(tp=2, users=8, offload="on"))
    row = _row(tmp_path)
    assert row["status"] == "SUCCESS" and row["replicas"] == 1 and _text(row["router"]) == ""
    assert _text(row["disagg"]) == ""
    for column in ("router_busiest_share", "replica_gpu_hit_min", "prefill_gpu_hit_rate"):
        assert pd.isna(row[column]), column
    assert row["gpu_hit_rate"] == pytest.approx(HIT["on"][0])


def _set(path: Path, **changes: object) -> None:
    doc = json.loads((path / "router.json").read_text())
    doc.update(changes)
    (path / "router.json").write_text(json.dumps(doc))


def _text_in_csv(path: Path) -> None:
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    rows[20][HITS] = "lots"
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)


BROKEN_ROUTER = [
    ("not JSON", lambda p: (p / "router.json").write_text("{not json"), "collect: router.json: not JSON"),
    ("a list", lambda p: (p / "router.json").write_text("[]"), "collect: router.json: expected an object, got list"),
    ("a folder", lambda p: ((p / "router.json").unlink(), (p / "router.json").mkdir()),
     "collect: router.json: not a regular file"),
    ("short counts", lambda p: _set(p, requests_by_replica=[3.0]),
     "collect: router.json: requests_by_replica has 1 entries for 2 instances"),
    ("text counts", lambda p: _set(p, requests_by_replica=["a", 2]),
     "collect: router.json: requests_by_replica must be a list of request counts"),
    ("share", lambda p: _set(p, busiest_replica_share=0.5),
     "collect: router.json: busiest_replica_share 0.5 but requests_by_replica gives 0.75"),
    ("match", lambda p: _set(p, mean_prefix_match_ratio=1.5),
     "collect: router.json: mean_prefix_match_ratio must be a fraction 0..1, got '1.5'"),
    ("branches", lambda p: _set(p, policy_branches={"tree_match": "many"}),
     "collect: router.json: policy_branches must map branch names to counts"),
    ("policy", lambda p: _set(p, policy="random"),
     "collect: router.json: policy 'random' but the cell's router is 'cache_aware'"),
    ("mode", lambda p: _set(p, mode="pd"), "collect: router.json: mode 'pd' but the cell is not disaggregated"),
    ("csv text", lambda p: _text_in_csv(p / "server_metrics.r1.csv"),
     "collect: server_metrics.r1.csv: prefix_cache_hits_total='lots' at time_s"),
    ("only a program", lambda p: (p / "router.json").write_text(json.dumps({"program": "smg"})),
     "collect: router.json: no requests_by_replica and no error saying why"),
    ("a 900 KB program", lambda p: (p / "router.json").write_text(json.dumps({"program": "x" * 900_000})),
     "collect: router.json: program: "),
]  # fmt: skip


@pytest.mark.parametrize(("what", "breaks", "reason"), BROKEN_ROUTER, ids=[b[0] for b in BROKEN_ROUTER])
def test_a_broken_router_json_or_instance_csv_makes_the_row_invalid_in_one_line(
    tmp_path, what, breaks, reason
):
    path = routed_cell(tmp_path, Spec(tp=1, users=4, offload="off"))
    breaks(path)
    row = _row(tmp_path)
    assert row["status"] == "INVALID", what
    assert reason in row["reason"]
    assert "\n" not in row["reason"] and "Traceback" not in row["reason"]


def test_router_json_is_read_once_and_its_error_is_the_rows_reason(tmp_path, monkeypatch):
    """collect's routed figures and checks take router.json from the cell's result, read once; one
    that breaks its contract is the row's INVALID reason word for word, never a MALFORMED row."""
    path = routed_cell(tmp_path, Spec(tp=1, users=4, offload="off"))
    (path / "router.json").write_text(json.dumps({"requests_by_replica": [-1]}))
    reads = count_router_reads(monkeypatch)
    row = _row(tmp_path)
    assert reads == [path]
    error = load_cell_result(path).router_error
    assert error is not None and error.startswith("router.json: requests_by_replica must be a list")
    assert row["status"] == "INVALID" and row["reason"] == f"collect: {error}"


@pytest.mark.parametrize(
    ("missing", "empty", "note", "reason"),
    [
        (
            "router.json", "router_busiest_share", "router.json missing: no router figures",
            "collect: router.json missing: a routed cell writes it",
        ),
        (
            "server_metrics.r1.csv", "replica_gpu_hit_min", "server_metrics.r1.csv missing",
            "collect: server_metrics.r1.csv missing: planned engine instance r1 left no scrapes",
        ),
    ],
)  # fmt: skip
def test_a_missing_routed_file_leaves_its_figures_empty_with_a_note(tmp_path, missing, empty, note, reason):
    path = routed_cell(tmp_path, Spec(tp=1, users=4, offload="off"))
    (path / missing).unlink()
    row = _row(tmp_path)
    # A file the cell's plan makes is missing: the row cannot be trusted (it was SUCCESS with blanks).
    assert row["status"] == "INVALID" and row["reason"] == reason
    assert pd.isna(row[empty]) and note in row["notes"]
    assert not pd.isna(row["gpu_hit_rate"])  # the merged figures stay


def test_a_missing_prefill_csv_leaves_the_prefill_rate_empty(tmp_path):
    path = pd_cell(tmp_path, Spec(tp=1))
    (path / "server_metrics.prefill.csv").unlink()
    row = _row(tmp_path)
    assert row["status"] == "SUCCESS" and pd.isna(row["prefill_gpu_hit_rate"])
    assert "server_metrics.prefill.csv missing" in row["notes"]


def test_collect_names_a_broken_router_json_on_one_line_and_exits_3(tmp_path, capsys):
    path = routed_cell(tmp_path / "art", Spec(tp=1, users=4, offload="off"))
    (path / "router.json").write_text("{")
    assert main(["collect", str(tmp_path / "art"), str(tmp_path / "out"), "--no-plots"]) == 3
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "router.json" in ln]
    assert len(lines) == 1 and "INVALID: collect: router.json: not JSON" in lines[0]


# --- one real routed cell: the simulated engine twice behind smg ------------------------------------


@pytest.fixture(scope="module")
def real_routed_cell(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import os
    import subprocess

    from agentsweep.contract.cell import CELL_ENV_VAR

    repo_root = Path(__file__).resolve().parents[2]
    exp = "rt-tp1-ep1-u4-off-r2-cache_aware"
    cell = {
        "config_key": "rt", "exp_name": exp, "runner": "local", "engine": "sim", "hardware": "h200",
        "model": "meta-llama/Llama-3.3-70B-Instruct", "precision": "fp8", "tp": 1, "users": 4,
        "offload": "off", "duration": 6, "traces": str(repo_root / "kv-cache-tester" / "sample_traces"),
        "max_context": 65536, "max_delay": 1, "warmup_requests": 0, "speed": 50,
        "engine_args": "--num-gpu-blocks-override 4096", "replicas": 2, "router": "cache_aware",
        "router_program": "smg",
        # What is checked here is collect, not run validity: room for a busy machine.
        "max_throughput_drift": 5.0, "min_window_coverage": 0.5, "max_dispatch_lag_p99_s": 2.0,
    }  # fmt: skip
    root = tmp_path_factory.mktemp("routed") / "results"
    env = {k: v for k, v in os.environ.items() if k not in (CELL_ENV_VAR, "PORT", "RESULT_DIR")}
    env.update({CELL_ENV_VAR: json.dumps(cell), "RESULT_DIR": str(root / "rt" / exp)})
    proc = subprocess.run(
        [str(repo_root / "benchmarks" / "run_cell.sh"), "--health-timeout", "60"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "rt" / exp


@pytest.mark.slow
def test_a_real_routed_cell_reads_its_router_and_replicas(real_routed_cell, tmp_path):
    row = _row(real_routed_cell.parent)
    assert row["status"] == "SUCCESS", row["reason"]
    router = json.loads((real_routed_cell / "router.json").read_text())
    counts = router["requests_by_replica"]
    assert row["router_busiest_share"] == pytest.approx(max(counts) / sum(counts))
    assert row["router_prefix_match"] == pytest.approx(router["mean_prefix_match_ratio"])
    branches = router["policy_branches"]
    assert row["router_affinity_share"] == pytest.approx(
        branches.get("tree_match", 0) / sum(branches.values())
    )
    # Per GPU over both replicas.
    assert row["gpus"] == 2
    assert row["output_tok_per_s_per_gpu"] == pytest.approx(row["output_tok_per_s"] / 2)
    # Each replica's rate is what collect gives a cell whose merged metrics are that replica's alone.
    rates = []
    for i in range(2):
        copy = tmp_path / f"r{i}" / real_routed_cell.name
        shutil.copytree(real_routed_cell, copy)
        shutil.copy(copy / f"server_metrics.r{i}.csv", copy / "server_metrics.csv")
        seal(copy)  # a cell whose merged metrics are that replica's: its receipt says so
        rates.append(_row(copy.parent)["gpu_hit_rate"])
    # A replica the router sent nothing in the window has no rate, and the spread leaves it out.
    rates = [rate for rate in rates if not pd.isna(rate)]
    assert rates, "neither replica had prefix-cache queries in the window"
    assert (row["replica_gpu_hit_min"], row["replica_gpu_hit_max"]) == pytest.approx((min(rates), max(rates)))
    # The merged rate is hits over queries of the summed counters, so it lies between the replicas'
    # rates, up to the merge taking each replica's row nearest to the first replica's scrape time
    # (metrics.scrapes.merge_metrics): a counter read a few milliseconds apart at each window edge.
    slack = max(0.005, 0.1 * max(rates))
    assert min(rates) - slack <= row["gpu_hit_rate"] <= max(rates) + slack


@pytest.mark.slow
def test_a_real_routed_cell_with_a_truncated_router_json_is_invalid(real_routed_cell, tmp_path):
    copy = tmp_path / "broken" / real_routed_cell.name
    shutil.copytree(real_routed_cell, copy)
    text = (copy / "router.json").read_text()
    (copy / "router.json").write_text(text[: len(text) // 2])
    seal(copy)  # written so by the cell: the receipt covers the truncated file
    row = _row(copy.parent)
    assert row["status"] == "INVALID"
    assert row["reason"].startswith("collect: router.json: not JSON")


def test_a_router_json_saying_why_it_has_no_counts_leaves_them_empty_with_a_note(tmp_path):
    path = routed_cell(tmp_path, Spec(tp=1, users=4, offload="off"))
    (path / "router.json").write_text(
        json.dumps(
            {"program": "smg", "policy": "cache_aware", "error": "cannot read http://127.0.0.1:1/metrics"}
        )
    )
    row = _row(tmp_path)
    assert row["status"] == "SUCCESS", row["reason"]
    assert (
        pd.isna(row["router_busiest_share"]) and "router.json: no router figures: cannot read" in row["notes"]
    )


def _drop_column(path: Path, column: str) -> None:
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    at = rows[0].index(column)
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([row[:at] + row[at + 1 :] for row in rows])


def test_results_written_before_a_column_existed_read_it_as_absent(tmp_path):
    """Routed results written before evicted_tokens_total: their instances still merge, the column
    reads empty (never a zero-row merge that makes the row INVALID)."""
    path = routed_cell(tmp_path, Spec(tp=1, users=4, offload="off"))
    for name in ("server_metrics.r0.csv", "server_metrics.r1.csv", "server_metrics.csv"):
        _drop_column(path / name, "evicted_tokens_total")
    row = _row(tmp_path)
    assert row["status"] == "SUCCESS", row["reason"]
    assert row["replica_gpu_hit_min"] == pytest.approx(0.5)
    # A column the instances hold and the merged table lost is still a merge that does not match.
    path = routed_cell(tmp_path / "b", Spec(tp=1, users=4, offload="off"))
    _drop_column(path / "server_metrics.csv", "prompt_tokens_total")
    row = _row(tmp_path / "b")
    assert (
        row["status"] == "INVALID"
        and "collect: server_metrics.csv: prompt_tokens_total None" in row["reason"]
    )
