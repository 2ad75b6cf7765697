"""capacity.json and steps/ in the result directory: declared first, one typed model, writer and reader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from agentsweep.contract.resultdir import (
    CAPACITY_JSON,
    CapacityRecord,
    StepRecord,
    TierResult,
    read_capacity,
    result_file,
    step_dir,
    write_capacity,
)
from agentsweep.errors import ResultFileError


def record(**changes: object) -> CapacityRecord:
    step = StepRecord(
        index=0, users=4, dir="steps/0", exp_name="c-step0-u4", status="SUCCESS",
        statistics={"ttft:p90": 1.5, "output_speed:p25": None},
    )  # fmt: skip
    tier = TierResult(
        tier="t", description="t (TTFT p90 ≤ 10 s)", boundary_users=None, agents_per_gpu=None,
        boundary_type="unresolved", stop_reason="interrupted", line="tier t (TTFT p90 ≤ 10 s): ...",
        interval_users=(4, None),
    )  # fmt: skip
    fields: dict[str, object] = {
        "exp_name": "c", "gpus": 1, "low": 2, "high": 16, "resolution": 0.0, "repeats": 1,
        "cliff_factor": 3.0, "time_limit_s": 3600.0, "step_budget": 10, "stop_reason": "interrupted",
        "tiers": (tier,), "steps": (step,),
    }  # fmt: skip
    return CapacityRecord.model_validate({**fields, **changes})


def test_declared_with_its_owner_and_limit() -> None:
    declared = result_file(CAPACITY_JSON)
    assert declared.owner == "agentsweep.contract.resultdir.capacity"
    assert declared.max_bytes == 16 << 20
    assert result_file("steps").name == "steps/" and result_file("steps/").when == "capacity cells"


def test_round_trip_and_absent(tmp_path: Path) -> None:
    assert read_capacity(tmp_path) is None
    write_capacity(tmp_path, record())
    assert read_capacity(tmp_path) == record()
    assert step_dir(tmp_path, 3) == tmp_path / "steps" / "3"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["steps"][0].update(dir="../../etc"),
            "capacity.json: steps[0].dir: String should match pattern",
        ),
        (lambda d: d.update(stop_reason="bored"), "capacity.json: stop_reason: 'bored' is not one of"),
        (
            lambda d: d["tiers"][0].update(boundary_type="cliffy"),
            "capacity.json: tiers[0].boundary_type: 'cliffy' is not one of",
        ),
        (lambda d: d.update(extra=1), "capacity.json: extra: unknown field"),
        (lambda d: d.update(gpus=0), "capacity.json: gpus: must be > 0, got 0"),
    ],
    ids=["step dir escapes", "unknown stop reason", "unknown boundary type", "unknown key", "no gpus"],
)
def test_a_broken_capacity_json_is_one_line(tmp_path: Path, change, expected: str) -> None:
    data = json.loads(record().to_json())
    change(data)
    (tmp_path / CAPACITY_JSON).write_text(json.dumps(data))
    with pytest.raises(ResultFileError) as err:
        read_capacity(tmp_path)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / CAPACITY_JSON)
    with pytest.raises(ResultFileError, match=r"capacity\.json: "):
        read_capacity(tmp_path)


def test_not_a_number_is_refused_in_writing() -> None:
    with pytest.raises(ValueError):
        record(engine_s=float("nan"))
