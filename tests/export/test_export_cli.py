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
