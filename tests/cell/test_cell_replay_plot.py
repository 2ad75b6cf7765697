"""The replayer's plot is drawn unless the environment turns it off; a value other than on/off is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentsweep.cell.clients.replay import REPLAY_PLOT_VAR, replay_command
from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError

CELL = Cell.parse({"exp_name": "x", "engine": "sim", "model": "m", "tp": 1, "users": 2, "offload": "off",
                   "traces": "t", "hardware": "h200", "duration": 60})  # fmt: skip


def argv() -> list[str]:
    return replay_command(CELL, endpoint="http://127.0.0.1:9", output_dir=Path("o"), python="python")


def test_the_plot_is_drawn_by_default_and_off_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REPLAY_PLOT_VAR, raising=False)
    assert "--no-plot" not in argv()
    monkeypatch.setenv(REPLAY_PLOT_VAR, "on")
    assert "--no-plot" not in argv()
    monkeypatch.setenv(REPLAY_PLOT_VAR, "Off")
    assert argv()[-1] == "--no-plot"


def test_another_value_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REPLAY_PLOT_VAR, "no")
    with pytest.raises(InputError, match=r"^\$AGENTSWEEP_REPLAY_PLOT: must be on or off, got 'no'$"):
        argv()
