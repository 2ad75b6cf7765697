"""capacity.json and steps/ in the result directory: declared first, one typed model, writer and reader;
a record whose figures its steps do not back (a boundary outside the range, agents per GPU that are not
its users over its GPUs, a boundary without its steps) is refused in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from agentsweep.capacity.search import tier_results
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

from tests.capacity.test_capacity_search import search, smooth_ttft, spec


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


def searched() -> CapacityRecord:
    """capacity.json as the search writes it: made-up steps (TTFT p90 = users / 2 s) searching 2..64,
    tier t ends at 20 users (smooth, bound at 21), tier all still holds at 64."""
    capacity = spec({"t": ["ttft p90 <= 10 s"], "all": ["ttft p90 <= 1000 s"]})
    steps = search(capacity, smooth_ttft)
    reason, tiers = tier_results(capacity, steps, gpus=1)
    return CapacityRecord(
        exp_name="c", gpus=1, low=2, high=64, resolution=0.0, repeats=1, cliff_factor=3.0,
        time_limit_s=3600.0, step_budget=40, stop_reason=reason, tiers=tuple(tiers), steps=tuple(steps),
    )  # fmt: skip


def _step_at(data: dict, users: int) -> dict:
    return next(s for s in data["steps"] if s["users"] == users)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["tiers"][0].update(boundary_users=80, agents_per_gpu=80.0),
            "tiers 't': boundary 80 users above the searched range 2..64",
        ),
        (
            lambda d: d["tiers"][0].update(agents_per_gpu=40.0),
            "tiers 't': 40.0 agents per GPU for 20 users on 1 GPU(s)",
        ),
        (lambda d: d.update(gpus=2), "tiers 't': 20.0 agents per GPU for 20 users on 2 GPU(s)"),
        (lambda d: d.update(steps=[]), "tiers 't': bound at 21 users, where no step ran"),
        (
            lambda d: _step_at(d, 20).update(status="INVALID", reasons=["x"]),
            "tiers 't': boundary 20 users has no SUCCESS step in 2..63",
        ),
        (
            lambda d: d.update(high=128),
            "tiers 'all': 'at least' needs boundary 128 with a SUCCESS step there",
        ),
        (
            lambda d: d["tiers"][0].update(
                cliff={
                    "below_users": 20,
                    "above_users": 21,
                    "statistic": "TTFT p90",
                    "below_value": 10.0,
                    "above_value": 10.5,
                    "factor": 1.05,
                }
            ),
            "tiers 't': a smooth boundary with cliff (20, 21)",
        ),
        (
            lambda d: d["tiers"][0].update(stop_reason="budget spent"),
            "tiers 't': a smooth boundary stopped by 'budget spent'",
        ),
        (
            lambda d: d["tiers"][0].update(boundary_type="unresolved", stop_reason="converged"),
            "stop_reason 'converged' with a tier unresolved",
        ),
        (lambda d: d["steps"][0].update(index=1), "steps[0]: index 1 in steps/0, expected 0 in steps/0"),
        (
            lambda d: d["steps"][0].update(users=1),
            "steps[0]: 1 users outside the searched range 2..64",
        ),
        (
            lambda d: d["tiers"][0].update(interval_users=[21, 30]),
            "tiers 't': interval 21..30 does not hold boundary 20 within 0..64",
        ),
    ],
    ids=[
        "boundary above range",
        "agents per gpu",
        "gpus",
        "no steps",
        "boundary at an invalid step",
        "at least below high",
        "cliff on a smooth boundary",
        "stop reason of a tier",
        "converged unresolved",
        "steps out of order",
        "step outside range",
        "interval",
    ],
)
def test_a_capacity_json_its_steps_do_not_back_is_refused_in_one_line(
    tmp_path: Path, change, expected
) -> None:
    data = json.loads(searched().to_json())
    change(data)
    (tmp_path / CAPACITY_JSON).write_text(json.dumps(data))
    with pytest.raises(ResultFileError) as err:
        read_capacity(tmp_path)
    assert str(err.value) == f"capacity.json: {expected}"
