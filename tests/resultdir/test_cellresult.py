"""A cell's result read once (``contract.cellresult``): its identity, verdict, summary figures and
failures by class typed; the first broken file a MalformedResult carrying what was read before it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from agentsweep.contract.cellresult import NO_RECEIPT_NOTE, MalformedResult, load_cell_result

from ..collect.conftest import Spec, write_cell
from ..collect.routed_cells import routed_cell
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


def test_router_json_is_held_with_its_own_error(tmp_path: Path) -> None:
    """A routed cell's router.json is read with the rest; one that breaks its contract is the router's
    error (collect's routed figures make the row INVALID), never a MalformedResult."""
    path = routed_cell(tmp_path, Spec(tp=1, users=8), counts=(30.0, 10.0))
    result = load_cell_result(path)
    assert result.router is not None and result.router_error is None
    assert result.router.requests_by_replica == (30.0, 10.0) and result.router.policy == "cache_aware"
    (path / "router.json").write_text(json.dumps({"requests_by_replica": [-1]}))
    broken = load_cell_result(path)
    assert broken.router is None and broken.summary is not None
    assert broken.router_error is not None
    assert broken.router_error.startswith("router.json: requests_by_replica must be a list of request counts")
    (path / "router.json").unlink()
    (path / "router.json").mkdir()
    assert load_cell_result(path).router_error == "router.json: not a regular file (a directory)"


def test_a_single_engine_cell_has_no_router_record(tmp_path: Path) -> None:
    result = load_cell_result(write_cell(tmp_path, Spec()))
    assert result.router is None and result.router_error is None
