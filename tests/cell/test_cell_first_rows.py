"""The replay waits for every collector's first row, so each count taken as last minus first starts
before the first request; a collector that never writes one, or exits, does not hold the cell."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from agentsweep.cell.engine_process import ManagedProcess
from agentsweep.cell.executor import _first_rows

pytestmark = pytest.mark.integration


def collector(tmp_path: Path, name: str, script: str) -> tuple[ManagedProcess, Path]:
    out = tmp_path / f"{name}.csv"
    argv = [sys.executable, "-c", script.format(out=str(out))]
    return ManagedProcess(argv, log_path=tmp_path / f"{name}.log", name=name).start(), out


def test_the_wait_ends_at_the_last_first_row_and_names_a_collector_that_writes_none(tmp_path: Path) -> None:
    spawned = time.monotonic()  # the slow one writes its row at least 1 s after this
    slow = collector(
        tmp_path,
        "slow",
        "import time; time.sleep(1.0); open({out!r}, 'w').write('time_s,x\\n1,2\\n'); time.sleep(30)",
    )
    silent = collector(
        tmp_path, "silent", "import time; open({out!r}, 'w').write('time_s,x\\n'); time.sleep(30)"
    )
    exited = collector(tmp_path, "exited", "raise SystemExit(3)")
    try:
        assert _first_rows([slow, exited], timeout_s=20.0) == []
        waited = time.monotonic() - spawned
        assert 1.0 <= waited < 15.0, waited  # until the slow one's row, not the timeout
        assert slow[1].read_text().count("\n") == 2
        assert _first_rows([slow, silent], timeout_s=0.5) == ["silent"]  # a header alone is no row
    finally:
        for proc, _out in (slow, silent, exited):
            proc.stop()
