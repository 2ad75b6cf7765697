"""The result directory's owner: each file written and read back through one typed model, and a broken
file named with its field in one line, never a traceback or a blocked read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from agentsweep.cell.record import write_result
from agentsweep.contract.cell import Cell, RoleShape, shape_label
from agentsweep.contract.resultdir import (
    CAPACITY_JSON,
    CELL_JSON,
    RECEIPT_JSON,
    RESULT_FILES,
    ROUTER_JSON,
    STATUS_TXT,
    CellStatus,
    RouterRecord,
    matrix_json,
    read_capacity,
    read_cell_record,
    read_matrix,
    read_router,
    read_status,
    result_file,
    write_router,
    write_status,
)
from agentsweep.errors import InputError, ResultFileError

CELL = Cell(
    exp_name="r-tp1-ep1-u2-off",
    engine="sim",
    model="m",
    tp=1,
    users=2,
    offload="off",
    duration=60,
    traces="t",
)
PD = CELL.replace(
    exp_name="r-tp1-ep1-u2-off-p1x4-d2x1-round_robin",
    router="round_robin",
    gpus=6,
    prefill={"replicas": 1, "tp": 4},
    decode={"replicas": 2, "tp": 1},
)


def _write(rd: Path, cell: dict[str, Any], status: str = "SUCCESS", reasons: tuple[str, ...] = ()) -> None:
    write_result(
        rd,
        cell=cell,
        engine_command=["agentsweep", "engine-sim", "m", "--api-key", "hidden-value"],
        engine_env={"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz"},
        replay_command=["kv-cache-tester", "replay"],
        versions={"agentsweep": "0.1.0", "engine": None},
        start_utc="2026-01-01T00:00:00Z",
        status=status,  # type: ignore[arg-type]
        reasons=reasons,
    )


def test_the_cell_record_round_trips_with_its_typed_cell(tmp_path: Path) -> None:
    _write(tmp_path, PD.model_dump(mode="json"))
    record = read_cell_record(tmp_path)
    assert record is not None and record.status == "SUCCESS" and record.reasons == ()
    assert record.engine_command[-1] == "***" and record.engine_env == {"HF_TOKEN": "***"}
    assert record.parse_cell() == PD and record.exp_name == PD.exp_name
    assert record.parse_cell().shape_label == "p1x4-d2x1"
    assert read_status(tmp_path) == CellStatus(verdict="SUCCESS")
    assert "scaleout" not in json.loads((tmp_path / CELL_JSON).read_text())


def test_a_refused_cell_keeps_what_it_was_given_and_says_why(tmp_path: Path) -> None:
    _write(
        tmp_path, {"exp_name": "x", "tp": "four"}, "FAILED", ("input error: cell.tp: expected an integer",)
    )
    record = read_cell_record(tmp_path)
    assert record is not None and record.cell == {"exp_name": "x", "tp": "four"}
    with pytest.raises(ResultFileError, match=r"^cell\.json: cell\.tp: expected an integer, got 'four'$"):
        record.parse_cell()
    status = read_status(tmp_path)
    assert status is not None and status.verdict == "FAILED"
    assert status.reason == "input error: cell.tp: expected an integer"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cell.json: not JSON"),
        ("[]", "cell.json: expected an object, got list"),
        (
            '{"schema_version": 2, "cell": {}, "status": "SUCCESS"}',
            "cell.json: schema_version: 2, expected 1",
        ),
        ('{"schema_version": 1, "status": "SUCCESS"}', "cell.json: cell: required field is missing"),
        ('{"schema_version": 1, "cell": {}, "status": "DONE"}', "cell.json: status: 'DONE' is not one of"),
        ('{"schema_version": 1, "cell": {}, "status": "FAILED", "engine_command": "x"}', "engine_command"),
        ('{"schema_version": 1, "cell": {}, "status": "FAILED", "colour": 1}', "cell.json: colour: unknown"),
    ],
)
def test_a_broken_cell_json_names_the_field(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / CELL_JSON).write_text(content)
    with pytest.raises(ResultFileError) as err:
        read_cell_record(tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_status_txt_absent_broken_or_blocking(tmp_path: Path) -> None:
    assert read_status(tmp_path) is None and read_cell_record(tmp_path) is None
    (tmp_path / STATUS_TXT).write_text("DONE\n")
    with pytest.raises(
        ResultFileError, match=r"^status\.txt: first line 'DONE', expected SUCCESS or INVALID"
    ):
        read_status(tmp_path)
    (tmp_path / STATUS_TXT).unlink()
    os.mkfifo(tmp_path / STATUS_TXT)
    with pytest.raises(ResultFileError, match=r"^status\.txt: not a regular file \(a FIFO\)$"):
        read_status(tmp_path)


def test_a_written_status_reads_back_and_a_verdict_needs_its_reasons(tmp_path: Path) -> None:
    written = CellStatus(verdict="INVALID", reasons=("failed_share: 3 of 100", "window_coverage: 90 %"))
    write_status(tmp_path, written)
    assert (tmp_path / STATUS_TXT).read_text() == "INVALID\nfailed_share: 3 of 100\nwindow_coverage: 90 %\n"
    assert read_status(tmp_path) == written
    with pytest.raises(ValueError, match="INVALID needs at least one reason"):
        write_status(tmp_path, CellStatus(verdict="INVALID"))


def test_the_router_record_writes_only_what_the_router_reported(tmp_path: Path) -> None:
    figures = {
        "program": "smg",
        "version": None,
        "mode": "dp",
        "policy": "cache_aware",
        "replicas": ["http://127.0.0.1:9000", "http://127.0.0.1:9001"],
        "requests_by_replica": [30.0, 10.0],
        "busiest_replica_share": 0.75,
        "policy_branches": {"tree_match": 36.0},
    }
    write_router(tmp_path, RouterRecord.from_figures(figures))
    assert json.loads((tmp_path / ROUTER_JSON).read_text()) == figures
    record = read_router(tmp_path)
    assert record is not None and record.requests_by_replica == (30.0, 10.0) and record.prefill is None


def test_figures_past_the_contract_leave_a_readable_router_json_that_says_why(tmp_path: Path) -> None:
    record = RouterRecord.from_figures({"program": "smg", "mode": "dp", "mean_prefix_match_ratio": 1.5})
    assert record.mean_prefix_match_ratio is None and record.program == "smg"
    assert record.error == (
        "the router's figures break the contract: figures: mean_prefix_match_ratio must be a fraction 0..1, "
        "got '1.5'"
    )
    write_router(tmp_path, record)
    assert read_router(tmp_path) == record


def test_a_broken_router_json_names_the_field(tmp_path: Path) -> None:
    (tmp_path / ROUTER_JSON).write_text(json.dumps({"mode": "xx"}))
    with pytest.raises(ResultFileError, match=r"^router\.json: mode: 'xx' is not one of dp, pd$"):
        read_router(tmp_path)
    (tmp_path / ROUTER_JSON).write_text(json.dumps({"requests_by_decode": [1, -2]}))
    with pytest.raises(ResultFileError, match=r"^router\.json: requests_by_decode must be a list of request"):
        read_router(tmp_path)


def test_the_matrix_reads_back_as_typed_cells_and_a_bad_cell_is_named(tmp_path: Path) -> None:
    path = tmp_path / "matrix.json"
    path.write_text(matrix_json([CELL, PD], indent=2))
    assert read_matrix(path) == [CELL, PD]
    path.write_text(json.dumps([CELL.model_dump(mode="json"), {**PD.model_dump(mode="json"), "users": 0}]))
    with pytest.raises(InputError) as err:
        read_matrix(path)
    assert str(err.value) == f"{path}: include[1].users: must be > 0, got 0"


def test_the_shape_label_is_spelled_once() -> None:
    assert shape_label(RoleShape(replicas=1, tp=4), RoleShape(replicas=2, tp=1)) == "p1x4-d2x1"
    assert CELL.shape_label == "" and PD.shape_label == "p1x4-d2x1"
    assert PD.exp_name.endswith(f"-{PD.shape_label}-round_robin")


def test_every_declared_file_resolves_and_an_undeclared_one_is_refused() -> None:
    for declared in RESULT_FILES:
        assert result_file(declared.name) is declared
    assert result_file("server_metrics.d1.csv").name == "server_metrics.<instance>.csv"
    assert result_file("server.p0.log").name == "server.<instance>.log"
    with pytest.raises(KeyError, match=r"gpu_power\.txt: not a declared result file"):
        result_file("gpu_power.txt")
    assert result_file("aiperf/profile_export.jsonl").name == "aiperf/"
    assert result_file("steps/0/summary.json").name == "steps/"
    with pytest.raises(KeyError):
        result_file("elsewhere/summary.json")


def test_the_receipt_is_declared_and_covers_every_other_file() -> None:
    from agentsweep.contract.receipt import RECEIPT_FILE

    declared = result_file(RECEIPT_JSON)
    assert declared.name == RECEIPT_FILE and declared.owner == "agentsweep.contract.receipt"
    assert declared.max_bytes is not None and "every other file" in declared.meaning


def test_capacity_json_reads_as_one_bounded_object(tmp_path: Path) -> None:
    assert read_capacity(tmp_path) is None
    (tmp_path / CAPACITY_JSON).write_text(
        json.dumps({"tiers": [{"slo": "p90_ttft_2s", "agents_per_gpu": 3}]})
    )
    assert read_capacity(tmp_path) == {"tiers": [{"slo": "p90_ttft_2s", "agents_per_gpu": 3}]}
    (tmp_path / CAPACITY_JSON).write_text("[1, 2]")
    with pytest.raises(ResultFileError, match=r"^capacity\.json: expected an object, got list"):
        read_capacity(tmp_path)
    (tmp_path / CAPACITY_JSON).unlink()
    os.mkfifo(tmp_path / CAPACITY_JSON)
    with pytest.raises(ResultFileError, match=r"^capacity\.json: not a regular file \(a FIFO\)"):
        read_capacity(tmp_path)


def test_the_owner_sits_in_the_contract_layer() -> None:
    """It imports the replayer's types and nothing of agentsweep above the contract layer."""
    import ast

    import agentsweep.contract.resultdir as owner

    for path in Path(owner.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentsweep"):
                assert node.module.startswith("agentsweep.contract") or node.module == "agentsweep.errors", (
                    path.name,
                    node.module,
                )
