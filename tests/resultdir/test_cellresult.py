"""A cell's result read once (``contract.cellresult``): its identity, verdict, summary figures and
failures by class typed; the first broken file a MalformedResult carrying what was read before it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from agentsweep.contract.cellresult import NO_RECEIPT_NOTE, MalformedResult, load_cell_result

from ..collect.conftest import Spec, write_cell
from ..store.conftest import seal


def test_a_success_cell_reads_whole(tmp_path: Path) -> None:
    spec = Spec(users=4)
    path = write_cell(tmp_path, spec)
    result = load_cell_result(path)
    assert result.cell is not None and result.cell.exp_name == spec.exp_name
    assert (result.status.verdict, result.status.reasons) == ("SUCCESS", ())
    assert result.identity.receipt is None and result.identity.notes == (NO_RECEIPT_NOTE,)
    assert result.capacity is None and result.summary is not None
    client, engine = result.figures()
    assert client["output_tok_per_s"] == pytest.approx(spec.output_tok_per_s())
    assert client["failed_by_class"] == json.dumps(dict(result.failed_by_class), separators=(",", ":"))
    assert engine == {}
    assert all(isinstance(n, int) for n in result.failed_by_class.values())


def test_a_sealed_cell_carries_its_receipt(tmp_path: Path) -> None:
    path = write_cell(tmp_path, Spec())
    seal(path)
    result = load_cell_result(path)
    assert result.identity.receipt is not None and result.identity.notes == ()


def test_a_failed_cell_has_no_summary(tmp_path: Path) -> None:
    path = write_cell(tmp_path, Spec(), status="FAILED", reason="engine OOM")
    result = load_cell_result(path)
    assert result.status.reasons == ("engine OOM",)
    assert result.summary is None and result.figures() == ({}, {}) and result.failed_by_class == {}


def test_failures_by_class_come_sorted_by_class(tmp_path: Path) -> None:
    path = write_cell(tmp_path, Spec())
    doc = json.loads((path / "summary.json").read_text())
    doc["counts"]["failed_by_class"] = {"b": 2, "a": 1}
    (path / "summary.json").write_text(json.dumps(doc))
    assert list(load_cell_result(path).failed_by_class.items()) == [("a", 1), ("b", 2)]


def test_a_broken_status_keeps_the_identity_read_before_it(tmp_path: Path) -> None:
    path = write_cell(tmp_path, Spec())
    (path / "status.txt").write_text("INVALID\nsomething\n")
    with pytest.raises(
        MalformedResult, match=re.escape("status.txt says INVALID but cell.json says SUCCESS")
    ) as err:
        load_cell_result(path)
    assert err.value.identity is not None and err.value.identity.notes == (NO_RECEIPT_NOTE,)


def test_a_receipt_mismatch_keeps_the_cell_but_no_receipt(tmp_path: Path) -> None:
    path = write_cell(tmp_path, Spec())
    seal(path)
    (path / "summary.json").write_text((path / "summary.json").read_text() + " ")
    with pytest.raises(
        MalformedResult, match=re.escape("does not match its receipt.json: summary.json")
    ) as err:
        load_cell_result(path)
    identity = err.value.identity
    assert identity is not None and identity.cell is not None
    assert identity.receipt is None and identity.notes == ()


def test_a_missing_cell_json_has_no_identity(tmp_path: Path) -> None:
    path = write_cell(tmp_path, Spec())
    (path / "cell.json").unlink()
    with pytest.raises(MalformedResult, match=re.escape("cell.json missing")) as err:
        load_cell_result(path)
    assert err.value.identity is None
