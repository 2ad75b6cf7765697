"""Scale-out axes in the config, the matrix and the cell: replicas and the router policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.config.matrix import exp_name
from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError

ENTRY = """\
so:
  runner: local
  engine: sim
  model: m
  precision: fp8
  duration: 10
  traces: kv-cache-tester/sample_traces
  search_space:
{space}
"""


def _matrix(tmp_path: Path, capsys: pytest.CaptureFixture[str], space: str, *flags: str) -> tuple[int, str]:
    config = tmp_path / "c.yaml"
    config.write_text(ENTRY.format(space=space))
    rc = main(["matrix", "--config", str(config), "--key", "so", *flags])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_replicas_and_routers_expand_into_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = (
        "    tp1: {users: 4, offload: [off, on]}\n"
        "    tp2: {users: 4, offload: [off, on], replicas: 3, router: [round_robin, cache_aware]}"
    )
    rc, out = _matrix(tmp_path, capsys, space, "--json")
    assert rc == 0, out
    cells = [Cell.parse(c) for c in json.loads(out)["include"]]
    by_name = {c.exp_name: c for c in cells}
    # A single engine keeps its original name and fields.
    single = by_name["so-tp1-ep1-u4-off"]
    assert (single.replicas, single.router, single.gpus) == (1, "", 1)
    assert by_name["so-tp1-ep1-u4-on"].cpu_dram_gb == 256.0  # 2048 GiB x 1/8
    routed = by_name["so-tp2-ep1-u4-on-r3-cache_aware"]
    assert (routed.replicas, routed.router, routed.gpus) == (3, "cache_aware", 6)
    assert routed.cpu_dram_gb == 1536.0  # the cell's 6 GPUs' share; each replica gets a third
    assert sorted(by_name) == sorted(
        [
            "so-tp1-ep1-u4-off",
            "so-tp1-ep1-u4-on",
            "so-tp2-ep1-u4-off-r3-round_robin",
            "so-tp2-ep1-u4-off-r3-cache_aware",
            "so-tp2-ep1-u4-on-r3-round_robin",
            "so-tp2-ep1-u4-on-r3-cache_aware",
        ]
    )


def test_dry_run_table_shows_the_scaleout_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _matrix(
        tmp_path, capsys, "    tp1: {users: 2, offload: off, replicas: 2, router: consistent_hash}", "--table"
    )
    assert rc == 0, out
    header, _rule, row = out.splitlines()[:3]
    assert header.split()[8:11] == ["replicas", "router", "gpus"]
    assert row.split()[8:11] == ["2", "consistent_hash", "2"]


def test_single_engine_table_is_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _matrix(tmp_path, capsys, "    tp1: {users: 2, offload: off}", "--table")
    assert rc == 0, out
    assert "replicas" not in out and "router" not in out


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        (
            "    tp4: {users: 2, offload: off, replicas: 3, router: round_robin}",
            "c.yaml:so.search_space.tp4.replicas: 3 replicas x tp 4 need 12 GPUs on 2 nodes but runner 'local' has "
            "8 per node and max_nodes 1",
        ),
        (
            "    tp1: {users: 2, offload: off, replicas: 2}",
            "c.yaml:so.search_space.tp1: replicas 2 need a router policy, e.g. router: [round_robin, "
            "cache_aware]",
        ),
        ("    tp1: {users: 2, offload: off, replicas: 2, router: fastest}", "search_space.tp1.router"),
        ("    tp1: {users: 2, offload: off, replicas: 0, router: random}", "search_space.tp1.replicas"),
    ],
)
def test_what_does_not_fit_is_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    space: str,
    expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(ENTRY.format(space=space))
    rc = main(["matrix", "--config", "c.yaml", "--key", "so"])
    captured = capsys.readouterr()
    assert rc == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines


def test_exp_name_encodes_the_new_axes_only_when_used() -> None:
    assert exp_name("k", 2, 1, 8, "off") == "k-tp2-ep1-u8-off"
    assert exp_name("k", 2, 1, 8, "off", 1, "") == "k-tp2-ep1-u8-off"
    assert exp_name("k", 2, 1, 8, "off", 2, "round_robin") == "k-tp2-ep1-u8-off-r2-round_robin"
    assert exp_name("k", 2, 1, 8, "off", 1, "cache_aware") == "k-tp2-ep1-u8-off-r1-cache_aware"


def test_cell_given_by_hand_is_held_to_the_same_rules() -> None:
    base = {
        "exp_name": "x", "tp": 2, "users": 1, "offload": "off", "engine": "sim", "model": "m",
        "duration": 5, "traces": "t",
    }  # fmt: skip
    assert Cell.parse({**base, "replicas": 2, "router": "random"}).gpus == 4
    with pytest.raises(InputError, match="replicas 2 need a router policy"):
        Cell.parse({**base, "replicas": 2})
    with pytest.raises(InputError, match="gpus 2 is fewer than tp 2 x replicas 2"):
        Cell.parse({**base, "replicas": 2, "router": "random", "gpus": 2})
    with pytest.raises(InputError, match=r"cell\.router_program"):
        Cell.parse({**base, "router_program": "nginx"})
