"""Property tests over random valid configs written as real YAML files."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from agentsweep.config import select_cells
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

TPS = (1, 2, 4, 8)
MODES = ("on", "off", "noprefix")
SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")

# Config keys are names (loader.CONFIG_KEY); keys outside it are refused (test_config_cli_output).
keys = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,19}", fullmatch=True)
users = st.lists(st.integers(1, 64), min_size=1, max_size=6)
modes = st.lists(st.sampled_from(MODES), min_size=1, max_size=5)


def _entry(space: Any) -> dict[str, Any]:
    return {
        "runner": "local", "engine": "sim", "model": "m", "precision": "fp8", "duration": 5,
        "traces": "t", "search_space": space,
    }  # fmt: skip


def _cells(config: dict[str, Any], patterns: list[str]):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(
            json.dumps(config, ensure_ascii=False), encoding="utf-8"
        )  # JSON is YAML: the real loader reads it
        return select_cells(path, patterns, max_cells=None)


def _glob_escape(key: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", key)


@given(
    key=keys,
    tps=st.lists(st.sampled_from(TPS), min_size=1, max_size=4),
    user_axis=users,
    mode_axis=st.one_of(st.none(), modes),
    per_tp_form=st.booleans(),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_count_is_the_product_of_deduped_axes(
    key: str, tps: list[int], user_axis: list[int], mode_axis: list[str] | None, per_tp_form: bool
) -> None:
    point: dict[str, Any] = {"users": user_axis if len(user_axis) > 1 else user_axis[0]}
    if mode_axis is not None:
        point["offload"] = mode_axis
    if per_tp_form:
        space: Any = {f"tp{tp}": point for tp in dict.fromkeys(tps)}
    else:
        space = [{"tp": tp, **point} for tp in tps]  # repeated tp entries must dedupe
    cells = _cells({key: _entry(space)}, [_glob_escape(key)])
    n_modes = len(set(mode_axis)) if mode_axis is not None else 2  # default offload [on, off]
    assert len(cells) == len(set(tps)) * len(set(user_axis)) * n_modes
    names = [c.exp_name for c in cells]
    assert len(set(names)) == len(names)
    assert all(SAFE.fullmatch(n) and len(n) < 200 for n in names)
    assert {(c.tp, c.users, c.offload) for c in cells} == {
        (t, u, m) for t in tps for u in user_axis for m in (mode_axis or ("on", "off"))
    }


@given(
    entries=st.dictionaries(
        keys,
        st.lists(st.tuples(st.sampled_from(TPS), st.booleans(), users, modes), min_size=1, max_size=4),
        min_size=1,
        max_size=4,
    )
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_exp_names_unique_across_keys_and_cells_deduped(entries: dict[str, list[Any]]) -> None:
    # Keys that differ only in case would collide; the generator must refuse those (tested in the
    # error tests), so keep keys distinct ignoring case here.
    safe = {k.lower() for k in entries}
    if len(safe) != len(entries):
        return
    config = {}
    expected = set()
    for key, points in entries.items():
        space = []
        for tp, use_ep, u, m in points:
            ep = tp if use_ep else 1
            space.append({"tp": tp, "ep": ep, "users": u, "offload": m})
            expected |= {(key, tp, ep, x, y) for x in u for y in m}
        config[key] = _entry(space)
    cells = _cells(config, ["*"])
    assert len(cells) == len(expected)
    assert {(c.config_key, c.tp, c.ep, c.users, c.offload) for c in cells} == expected
    names = [c.exp_name for c in cells]
    assert len(set(names)) == len(names)
    assert all(SAFE.fullmatch(n) for n in names)
