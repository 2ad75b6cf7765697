"""The strict YAML reader: duplicate keys at any depth, YAML 1.1 booleans, anchors and hidden keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentsweep.config import load_sweep
from agentsweep.config.loader import read_yaml
from agentsweep.errors import ConfigError


def _read(tmp_path: Path, text: str):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return read_yaml(path)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("a: 1\nb: 2\na: 3\n", "a: duplicate key (first at line 1, again at line 3)"),
        ("a:\n  b:\n    c: 1\n    c: 2\n", "a.b.c: duplicate key (first at line 3, again at line 4)"),
        ("a:\n  - {x: 1, x: 2}\n", "a[0].x: duplicate key (first at line 2, again at line 2)"),
        ("a:\n  tp4: {}\n  'tp4': {}\n", "a.tp4: duplicate key (first at line 2, again at line 3)"),
    ],
)
def test_duplicate_keys_are_detected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, where: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        _read(tmp_path, text)
    assert str(err.value) == f"x.yaml:{where}; YAML would silently keep only the last one"


def test_merge_override_is_not_a_duplicate(tmp_path: Path) -> None:
    data = _read(tmp_path, ".base: &b {x: 1, y: 2}\na:\n  <<: *b\n  x: 3\n")
    assert data["a"] == {"x": 3, "y": 2}


def test_only_true_false_are_booleans(tmp_path: Path) -> None:
    data = _read(tmp_path, "o: [on, off, yes, no, noprefix]\nt: true\nf: False\n")
    assert data == {"o": ["on", "off", "yes", "no", "noprefix"], "t": True, "f": False}


def test_hidden_keys_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        ".r: &r {seed: 7, max_delay: 5}\n"
        "k:\n  runner: local\n  engine: sim\n  model: m\n  precision: fp8\n  duration: 3\n  traces: t\n"
        "  replay: *r\n  engine_args: [--a, 'b c']\n  engine_env: {X: 1}\n"
        "  search_space:\n    - {tp: 2, ep: 2, users: 3, offload: noprefix}\n"
    )
    spec = load_sweep(tmp_path / "c.yaml", "k")
    assert (spec.replay.seed, spec.replay.max_delay, spec.replay.timing_strategy) == (7, 5.0, "think-only")
    assert spec.engine_args == "--a 'b c'" and spec.engine_env == {"X": "1"}
    (point,) = spec.search_space
    assert (point.tp, point.ep, point.users, point.offload) == (2, 2, (3,), ("noprefix",))
    with pytest.raises(ConfigError, match=r":\.r: no such config key"):
        load_sweep(tmp_path / "c.yaml", ".r")
