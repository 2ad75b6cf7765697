"""Disaggregated prefill/decode points and multi-node cells in the config, the matrix and the cell."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.config.matrix import nodes_needed
from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError

ENTRY = """\
pd:
  runner: {runner}
  engine: sim
  model: m
  precision: fp8
  duration: 10
  traces: kv-cache-tester/sample_traces
  search_space:
{space}
"""
RUNNERS = """\
two:
  runs_on: [self-hosted]
  launcher: runners/launch_local.sh
  gpus_per_node: 4
  cpu_dram_gb: 400
  container_runtime: none
  max_nodes: 2
  hardware: h200
"""


def _matrix(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    space: str,
    runner: str = "two",
) -> tuple[int, str]:
    config = tmp_path / "c.yaml"
    config.write_text(ENTRY.format(space=space, runner=runner))
    runners = tmp_path / "runners.yaml"
    runners.write_text(RUNNERS)
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", str(runners))
    rc = main(["matrix", "--config", str(config), "--key", "pd", "--json"])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_a_prefill_decode_point_is_one_cell_per_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    space = (
        "    - {users: 4, offload: on, prefill: {replicas: 2, tp: 1}, decode: {tp: 2}, router: [round_robin]}"
    )
    rc, out = _matrix(tmp_path, capsys, monkeypatch, space)
    assert rc == 0, out
    (cell,) = [Cell.parse(c) for c in json.loads(out)["include"]]
    assert cell.exp_name == "pd-tp2-ep1-u4-on-p2x1-d1x2-round_robin"
    assert cell.disaggregated and cell.tp == 2 and cell.replicas == 1
    assert (cell.gpus, cell.nodes) == (4, 1)
    assert cell.instance_tps == [1, 1, 2]
    assert cell.cpu_dram_gb == 400.0  # the 4 GPUs' share of the node


def test_a_cell_past_one_node_takes_more_nodes_up_to_the_runner_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, out = _matrix(
        tmp_path, capsys, monkeypatch, "    tp2: {users: 4, offload: off, replicas: 3, router: [cache_aware]}"
    )
    assert rc == 0, out
    (cell,) = [Cell.parse(c) for c in json.loads(out)["include"]]
    assert (cell.gpus, cell.nodes) == (6, 2)
    rc, out = _matrix(
        tmp_path, capsys, monkeypatch, "    tp4: {users: 4, offload: off, replicas: 3, router: [cache_aware]}"
    )
    assert rc == 2
    assert "3 replicas x tp 4 need 12 GPUs on 3 nodes but runner 'two' has 4 per node and max_nodes 2" in out


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            "{users: 4, prefill: {tp: 1}, router: [round_robin]}",
            "needs both prefill and decode; decode is missing",
        ),
        ("{users: 4, prefill: {tp: 1}, decode: {tp: 1}}", "needs a router policy"),
        ("{tp: 2, users: 4, prefill: {tp: 1}, decode: {tp: 1}, router: [random]}", "must equal decode.tp 1"),
        ("{users: 4, prefill: {tp: 1}, decode: {tp: 1}, replicas: 2, router: [random]}", "prefill.replicas"),
        (
            "{users: 4, prefill: {tp: 16}, decode: {tp: 1}, router: [random]}",
            "pd.search_space[0].prefill.tp: tp 16 needs 16 GPUs but runner 'two' has 4 per node",
        ),
    ],
)
def test_bad_disaggregated_points_are_refused_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    space: str,
    message: str,
) -> None:
    rc, out = _matrix(tmp_path, capsys, monkeypatch, f"    - {space}")
    assert rc == 2
    assert message in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out


def test_a_hand_made_cell_is_held_to_the_same_rules() -> None:
    base = {"exp_name": "x", "tp": 1, "users": 1, "offload": "off", "engine": "sim", "model": "m",
            "precision": "fp8", "image": "", "duration": 5, "traces": "t", "runner": "local"}  # fmt: skip
    cell = Cell.parse({**base, "prefill": {"tp": 1}, "decode": {"tp": 1}, "router": "round_robin"})
    assert cell.gpus == 2 and cell.disaggregated
    with pytest.raises(InputError, match="gpus 1 is fewer than prefill 1x1 \\+ decode 1x1 = 2"):
        Cell.parse({**base, "prefill": {"tp": 1}, "decode": {"tp": 1}, "router": "random", "gpus": 1})
    with pytest.raises(InputError, match="decode is missing"):
        Cell.parse({**base, "prefill": {"tp": 1}, "router": "random"})


def test_nodes_are_packed_in_order() -> None:
    assert nodes_needed([1], 8) == 1
    assert nodes_needed([4, 4, 4], 8) == 2
    assert nodes_needed([2, 8, 2], 8) == 3  # an instance never splits across nodes
    assert nodes_needed([1] * 16, 8) == 2


def test_the_table_shows_role_shapes_and_nodes_when_a_cell_has_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "c.yaml"
    space = (
        "    - {tp: 2, users: 4, offload: off, replicas: 3, router: [random]}\n"
        "    - {users: 4, offload: off, prefill: {replicas: 2, tp: 1}, decode: {tp: 2}, router: [random]}"
    )
    config.write_text(ENTRY.format(space=space, runner="two"))
    (tmp_path / "runners.yaml").write_text(RUNNERS)
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", str(tmp_path / "runners.yaml"))
    assert main(["matrix", "--config", str(config), "--key", "pd", "--table"]) == 0
    header, _, dp, pd, *_ = capsys.readouterr().out.splitlines()
    assert header.split()[-5:] == ["prefill", "decode", "nodes", "cpu_dram_gb", "duration"]
    assert dp.split()[-5:] == ["-", "-", "2", "-", "10"]
    assert pd.split()[-5:] == ["2x1", "1x2", "1", "-", "10"]
