"""--resume of an interrupted capacity search: the steps that stand are kept and not measured again,
the rest of the cell's directory goes; a step that changed since, a FAILED one, or one of another
search runs again (with every step after it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.capacity.steps import keep_measured, measured_steps
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR
from agentsweep.sweep.local import plan_sweep, prepare

from tests.capacity.synthetic import TIERS, capacity_cell, capacity_dir


def interrupted(root: Path, **cell: object) -> Path:
    """A search SIGTERM stopped in its third step (4 users): two steps stand, the third is FAILED."""
    return capacity_dir(
        root,
        capacity_cell(**cell),  # type: ignore[arg-type]
        steps=3,
        statuses=lambda index, users: "FAILED" if index == 2 else "SUCCESS",
        ended="interrupted",
        verdict="FAILED",
        reasons=["interrupted by SIGTERM"],
    )


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_the_steps_that_stand_are_kept_byte_for_byte_and_the_rest_goes(tmp_path: Path) -> None:
    path = interrupted(tmp_path)
    before = _tree(path)
    record = json.loads((path / "capacity.json").read_text())
    lines = keep_measured(capacity_cell(), path)
    assert lines == [
        "--resume keeps 2 measured step(s) (users 1, 2)",
        "measured again from steps/2: FAILED (interrupted by SIGTERM): it measured nothing",
    ]
    after = _tree(path)
    assert sorted({name.split("/")[1] for name in after}) == ["0", "1"]
    assert all(name.startswith("steps/") and data == before[name] for name, data in after.items())
    kept, why = measured_steps(capacity_cell(), path)
    assert why is None
    # Read again from the steps' own files: what the search wrote of them.
    assert [(s.users, s.status, s.statistics) for s in kept] == [
        (s["users"], s["status"], s["statistics"]) for s in record["steps"][:2]
    ]


def test_a_step_changed_since_runs_again_with_every_step_after_it(tmp_path: Path) -> None:
    path = interrupted(tmp_path)
    with (path / "steps" / "1" / "requests.jsonl").open("a") as fh:
        fh.write("\n")
    lines = keep_measured(capacity_cell(), path)
    assert lines == [
        "--resume keeps 1 measured step(s) (users 1)",
        "measured again from steps/1: does not match its receipt (requests.jsonl: changed)",
    ]
    assert sorted(p.name for p in (path / "steps").iterdir()) == ["0"]


def test_steps_of_another_search_are_not_kept(tmp_path: Path) -> None:
    # Another duration: each step ran another cell. The directory goes, as for any unfinished cell.
    path = interrupted(tmp_path)
    lines = keep_measured(capacity_cell(duration=30), path)
    assert lines == ["measured again from steps/0: ran another cell than this search's step at 1 users"]
    assert not path.exists()
    # Other tiers over the same counts: the measurements stand (their statistics are read again).
    path = interrupted(tmp_path / "b")
    tiers = [{"name": "other", "constraints": ["ttft p99 <= 100 s"]}, *TIERS]
    kept, _ = measured_steps(capacity_cell(tiers=tiers), path)
    assert [s.users for s in kept] == [1, 2] and all("ttft:p99" in s.statistics for s in kept)


def test_a_search_whose_counts_went_elsewhere_keeps_what_it_would_still_pick(tmp_path: Path) -> None:
    path = interrupted(tmp_path)  # 1, 2, then 4 users
    # Two runs per count: the search now runs 1 user a second time before it goes on to 2.
    kept, why = measured_steps(capacity_cell(repeats=2), path)
    assert [s.users for s in kept] == [1]
    assert why == "steps/1: ran 2 users where the search now takes 1 users"


@pytest.mark.parametrize("force", [False, True])
def test_the_sweep_keeps_the_steps_on_resume_and_not_with_force(tmp_path: Path, capsys, force: bool) -> None:
    cell = capacity_cell()
    results = tmp_path / "results"
    (results / cell.config_key).mkdir(parents=True)
    interrupted(tmp_path / "x").rename(results / cell.config_key / cell.exp_name)
    plans = plan_sweep([cell], results)
    assert plans[0].runs[0].state == "pending"  # FAILED: to run again
    prepare(plans, force=force)
    path = results / cell.config_key / cell.exp_name
    if force:
        assert not path.exists()
    else:
        assert sorted(p.relative_to(path).as_posix() for p in path.iterdir()) == ["steps"]
        assert f"sweep: {cell.exp_name}: --resume keeps 2 measured step(s)" in capsys.readouterr().out


def test_the_cell_refuses_a_steps_folder_it_cannot_stand_on(tmp_path: Path, monkeypatch, capsys) -> None:
    path = interrupted(tmp_path)
    keep_measured(capacity_cell(), path)
    (path / "steps" / "5").mkdir()  # not a step of this search
    cell = capacity_cell()
    monkeypatch.setenv(CELL_ENV_VAR, cell.to_json())
    monkeypatch.setenv("RESULT_DIR", str(path))
    monkeypatch.setenv("PORT", "8000")
    assert main(["cell"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"RESULT_DIR={path}: steps/5 is not a finished step of this search" in err
    assert "agentsweep sweep --resume" in err
    assert (path / "steps" / "0" / "receipt.json").exists()  # what stood, stands
