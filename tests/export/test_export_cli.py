"""`agentsweep export` on collect's synthetic sweeps: which cells become rows, older summaries,
bad input and points measured differently."""

from __future__ import annotations

import json

from agentsweep.cli import main
from agentsweep.export.schema import problems

from ..collect.test_collect_provenance import reseal
from ..store.conftest import SMALL, make_sweep


def _export(root, out, *extra: str) -> int:
    return main(["export", "--format", "inferencex", str(root), "-o", str(out), *extra])


def test_only_success_points_unless_include_invalid_then_with_their_outcome(tmp_path, capsys):
    failed = SMALL[1].exp_name
    make_sweep(tmp_path / "a", SMALL, failed=[failed])
    assert _export(tmp_path / "a", tmp_path / "rows.json") == 0
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert sorted(r["exp_name"] for r in rows) == sorted(s.exp_name for s in SMALL if s.exp_name != failed)
    assert {r["outcome"] for r in rows} == {"SUCCESS"}
    assert f"{failed}: FAILED, not exported" in capsys.readouterr().err
    for shape in ("flat", "nested"):
        out = tmp_path / f"{shape}.json"
        assert _export(tmp_path / "a", out, "--shape", shape, "--include-invalid") == 0
        rows = json.loads(out.read_text())
        assert len(rows) == len(SMALL)
        assert {r["exp_name"]: r["outcome"] for r in rows}[failed] == "FAILED"
        assert all(problems(r, shape) == [] for r in rows)


def test_a_summary_written_before_the_new_figures_still_exports(tmp_path):
    # The synthetic cells' summaries hold no p75, std, full-response ITL, steady-window bounds or
    # stability block: those are null, interactivity comes from TPOT (the same figure per request).
    make_sweep(tmp_path / "a", SMALL[:1])
    assert _export(tmp_path / "a", tmp_path / "rows.json") == 0
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["p75_ttft"] is None and row["std_e2el"] is None and row["observed_window_count"] is None
    assert row["median_intvty"] == 1 / row["median_tpot"]
    assert row["median_itl"] is None and row["tput_per_gpu"] > 0


def test_no_cells_is_one_line_and_status_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert _export(tmp_path / "empty", tmp_path / "rows.json") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("input error: ") and "no cell result directories" in err
    assert not (tmp_path / "rows.json").exists()


def test_two_replayer_versions_are_refused_unless_allowed(tmp_path, capsys):
    paths = make_sweep(tmp_path / "a", SMALL)
    reseal(paths[1], replayer="9.9.9")
    assert _export(tmp_path / "a", tmp_path / "rows.json") == 2
    err = capsys.readouterr().err.strip()
    assert "replayer versions differ" in err and "--allow-mixed" in err
    assert not (tmp_path / "rows.json").exists()
    assert _export(tmp_path / "a", tmp_path / "rows.json", "--allow-mixed") == 0
    assert len(json.loads((tmp_path / "rows.json").read_text())) == len(SMALL)


def _only_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_an_output_that_is_a_fifo_or_a_device_is_refused_and_left_as_it_is(tmp_path, capsys):
    """A rename onto a FIFO or a device node replaces it with a regular file: refused before any work."""
    import os
    import stat

    make_sweep(tmp_path / "a", SMALL[:1])
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    assert _export(tmp_path / "a", fifo) == 2
    assert _only_line(capsys) == f"input error: -o {fifo}: exists and is not a regular file (a FIFO); " + (
        "name a regular file (or a new one)"
    )
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    if os.geteuid() == 0:  # only root makes device nodes: /dev/null's twin
        device = tmp_path / "null"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        assert _export(tmp_path / "a", device) == 2
        assert "exists and is not a regular file (a character device)" in _only_line(capsys)
        assert stat.S_ISCHR(device.lstat().st_mode)
    folder = tmp_path / "folder"
    folder.mkdir()
    assert _export(tmp_path / "a", folder) == 2
    assert "exists and is not a regular file (a directory)" in _only_line(capsys)
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    assert _export(tmp_path / "a", link) == 2
    assert _only_line(capsys).endswith(f"-o {link}: is a symbolic link; name a regular file (or a new one)")
    assert link.is_symlink() and not (tmp_path / "elsewhere.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file


def test_an_existing_regular_output_is_replaced_and_a_long_name_is_one_line(tmp_path, capsys):
    make_sweep(tmp_path / "a", SMALL[:1])
    out = tmp_path / "rows.json"
    out.write_text("old")
    assert _export(tmp_path / "a", out) == 0
    assert len(json.loads(out.read_text())) == 1
    capsys.readouterr()
    long = tmp_path / ("x" * 300 + ".json")
    assert _export(tmp_path / "a", long) == 2
    assert _only_line(capsys) == f"input error: -o {long}: cannot write there: file name too long"
