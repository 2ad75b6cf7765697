"""Collect never blocks or reads without bound, and says what it skipped."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from agentsweep.cli import main
from agentsweep.collect.aggregate import build_rows, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.contract.resultdir import read_matrix as load_matrix
from agentsweep.contract.resultdir import read_status
from agentsweep.errors import InputError, ResultFileError


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "collect", *args],
        capture_output=True,
        text=True,
        timeout=20,  # a blocked read would hang: the timeout fails the test
    )


@pytest.mark.integration
def test_a_fifo_status_or_summary_is_malformed_not_a_hang(tmp_path, cell_factory, spec_cls):
    a = cell_factory(tmp_path / "arts", spec_cls(tp=1, users=2, offload="off"))
    b = cell_factory(tmp_path / "arts", spec_cls(tp=1, users=8, offload="off"))
    (a / "status.txt").unlink()
    os.mkfifo(a / "status.txt")
    (b / "summary.json").unlink()
    os.mkfifo(b / "summary.json")
    proc = _collect(str(tmp_path / "arts"), str(tmp_path / "out"), "--no-plots")
    assert proc.returncode == 1, proc.stderr
    reasons = sorted(r["reason"] for r in _rows(tmp_path / "out"))
    assert reasons == ["status.txt: not a regular file (a FIFO)", "summary.json: not a regular file (a FIFO)"]
    # The local sweep's reader (the one reader of status.txt) says the same instead of blocking.
    with pytest.raises(ResultFileError) as err:
        read_status(a)
    assert str(err.value) == "status.txt: not a regular file (a FIFO)"


def _rows(out):
    with open(out / "summary.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_summary_linked_to_an_endless_device_is_refused_unread(tmp_path, cell_factory, spec_cls):
    path = cell_factory(tmp_path, spec_cls(tp=1, users=2, offload="off"))
    (path / "summary.json").unlink()
    (path / "summary.json").symlink_to("/dev/zero")
    df = to_frame(build_rows(find_cells(tmp_path)))
    assert df.iloc[0]["status"] == "MALFORMED"
    assert (
        df.iloc[0]["reason"] == "summary.json: a symbolic link (to '/dev/zero'); only regular files are read"
    )


@pytest.mark.integration
def test_a_linked_cell_directory_outside_the_tree_is_named(tmp_path, cell_factory, spec_cls):
    outside = cell_factory(tmp_path / "elsewhere", spec_cls(tp=1, users=2, offload="off"))
    inside = cell_factory(tmp_path / "arts", spec_cls(tp=1, users=8, offload="off"))
    (tmp_path / "arts" / "agentic_linked").symlink_to(outside, target_is_directory=True)
    (tmp_path / "arts" / "agentic_alias").symlink_to(inside, target_is_directory=True)
    skipped: list[str] = []
    found = find_cells(tmp_path / "arts", skipped)
    assert {c.path.name for c in found} == {inside.name, "agentic_alias"}  # a link inside is followed
    assert len(skipped) == 1 and "agentic_linked" in skipped[0] and "not followed" in skipped[0]
    proc = _collect(str(tmp_path / "arts"), str(tmp_path / "out"), "--no-plots")
    assert "agentic_linked: a link to" in proc.stderr


def test_duplicate_exp_names_in_the_matrix_are_refused(tmp_path):
    path = tmp_path / "matrix.json"
    path.write_text(
        json.dumps({"include": [{"exp_name": "a-tp1"}, {"exp_name": "b"}, {"exp_name": "A-TP1"}]})
    )
    with pytest.raises(InputError, match="cells 0 and 2 share the exp_name 'A-TP1'"):
        load_matrix(path)


def test_collect_exits_3_when_the_only_problems_are_invalid_cells(tmp_path, cell_factory, spec_cls):
    path = cell_factory(tmp_path / "arts", spec_cls(tp=1, users=2, offload="off"))
    cell_factory(tmp_path / "arts", spec_cls(tp=1, users=8, offload="off"))
    summary = json.loads((path / "summary.json").read_text())
    summary["counts"]["ok"] += 5  # sent no longer equals ok + failed
    (path / "summary.json").write_text(json.dumps(summary))
    assert main(["collect", str(tmp_path / "arts"), str(tmp_path / "out"), "--no-plots"]) == 3
    rows = {r["exp_name"]: r for r in _rows(tmp_path / "out")}
    assert sorted(r["status"] for r in rows.values()) == ["INVALID", "SUCCESS"]
    (path / "status.txt").unlink()  # now a broken directory: MALFORMED wins with 1
    assert main(["collect", str(tmp_path / "arts"), str(tmp_path / "out2"), "--no-plots"]) == 1
