"""Collect onto a disk that fills up: one line naming the file it could not write, exit status 2, no
traceback, no temporary file and none of its outputs (never a partial set that reads as complete; a
small tmpfs, filled, as the real thing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.collect.cli_collect import OUTPUTS

from tests.support import filled_tmpfs

from .conftest import Spec, write_cell


@pytest.mark.integration
@pytest.mark.parametrize("leave_kib", [0, 48, 160])
def test_collect_on_a_full_disk_names_the_file_in_one_line(tmp_path, capsys, leave_kib):
    for users in (1, 2, 4, 8):
        for offload in ("on", "off"):
            write_cell(tmp_path / "art", Spec(users=users, offload=offload))
    with filled_tmpfs(tmp_path / "small", 1024, leave_kib) as mount:
        out = mount / "aggregated"
        code = main(["collect", str(tmp_path / "art"), str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, err
        (line,) = [ln for ln in err if "cannot write" in ln]
        assert line.startswith(f"write error: {out}/")
        assert line.endswith(
            f": cannot write: no space left on device; none of its outputs are left in {out}"
        )
        assert "Traceback" not in "\n".join(err)
        assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp")) == []
        assert sorted(p.name for name in OUTPUTS for p in out.glob(name)) == []


@pytest.mark.integration
def test_a_full_disk_also_removes_an_earlier_collects_outputs(tmp_path, capsys):
    """A complete set from an earlier run is not left beside a new partial one."""
    for users in (1, 2):
        write_cell(tmp_path / "art", Spec(users=users))
    with filled_tmpfs(tmp_path / "small", 16384, 16000) as mount:
        out = mount / "aggregated"
        assert main(["collect", str(tmp_path / "art"), str(out)]) == 0
        assert (out / "report.html").exists() and (out / "summary.csv").exists()
        for users in (4, 8, 16, 32):
            write_cell(tmp_path / "art", Spec(users=users, offload="on"))
        with open(mount / ".more", "wb") as fh:  # what is left fits the tables, not the plots
            fh.write(bytes(max(0, _free(mount) - (24 << 10))))
        assert main(["collect", str(tmp_path / "art"), str(out)]) == 2
        capsys.readouterr()
        assert sorted(p.name for name in OUTPUTS for p in out.glob(name)) == []


def _free(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize
