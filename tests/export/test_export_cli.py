"""`agentsweep export` on synthetic sweeps: the files laid out as InferenceX's collector and ingest read
them, which cells become rows (a capacity cell's steps, not the cell), cells that depart from their
receipts, points measured differently, and bad input (one line, exit status 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.export.schema import problems

from ..capacity.synthetic import capacity_dir
from ..collect.conftest import Spec
from ..collect.test_collect_provenance import reseal
from .inferencex_ingest import Skipped, map_row, read_artifacts
from .sweeps import sweep

SMALL = [Spec(tp=1, users=u, offload=o) for u in (2, 8) for o in ("on", "off")]


def _export(root: Path, out: Path, *extra: str) -> int:
    return main(["export", "--format", "inferencex", str(root), "-o", str(out), *extra])


def _rows(out: Path) -> list[dict]:
    return json.loads((out / "results_bmk" / "agg_bmk.json").read_text())


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], code: int, out: Path) -> str:
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and err.startswith("input error: ")
    assert not out.exists() and not any(out.parent.glob(f".{out.name}.tmp-*"))
    return err


def test_the_files_are_laid_out_as_their_collector_and_ingest_read_them(tmp_path):
    sweep(tmp_path / "a", SMALL)
    assert _export(tmp_path / "a", tmp_path / "out") == 0
    files = read_artifacts(tmp_path / "out")
    names = sorted(s.exp_name for s in SMALL)
    per_job = [f for f in files if f.path.startswith("bmk_agentic_")]
    assert [f.path for f in per_job] == [f"bmk_agentic_{n}/{n}.json" for n in names]
    assert all(len(f.rows) == 1 and f.non_object_rows == 0 for f in per_job)
    (aggregate,) = [f for f in files if f.path == "results_bmk/agg_bmk.json"]
    assert aggregate.rows == [f.rows[0] for f in per_job] and aggregate.non_object_rows == 0
    for name in names:
        raw = tmp_path / "out" / f"agentic_{name}" / "aiperf_artifacts"
        server = json.loads((raw / "server_metrics_export.json").read_text())["metrics"]
        assert server["vllm:kv_cache_usage_perc"]["series"][0]["stats"]["max"] <= 1.0
        assert (raw / "profile_export.jsonl").is_file()


def test_only_success_points_unless_include_invalid_and_those_stay_out_of_their_curves(tmp_path, capsys):
    failed, invalid = SMALL[1].exp_name, SMALL[2].exp_name
    sweep(tmp_path / "a", SMALL, failed=[failed], invalid=[invalid])
    assert _export(tmp_path / "a", tmp_path / "out") == 0
    rows = _rows(tmp_path / "out")
    assert sorted(r["exp_name"] for r in rows) == sorted(
        s.exp_name for s in SMALL if s.exp_name not in (failed, invalid)
    )
    assert {r["benchmark_outcome"]["status"] for r in rows} == {"passed"}
    assert f"{failed}: FAILED, not exported" in capsys.readouterr().err
    for shape in ("flat", "nested"):
        out = tmp_path / shape
        assert _export(tmp_path / "a", out, "--shape", shape, "--include-invalid") == 0
        rows = _rows(out)
        assert len(rows) == len(SMALL) and all(problems(r, shape) == [] for r in rows)
        by_name = {r["exp_name"]: r for r in rows}
        assert by_name[invalid]["benchmark_outcome"]["reasons"] == ["dispatch lag p99 3.1 s > 2 s"]
        for name in (failed, invalid):
            with pytest.raises(Skipped, match="failedRun"):
                map_row(by_name[name])


def test_an_unmapped_model_is_one_line_naming_the_field_unless_allowed(tmp_path, capsys):
    sweep(tmp_path / "a", SMALL, model="Qwen/Qwen3-32B")
    err = _one_line_exit_2(capsys, _export(tmp_path / "a", tmp_path / "out"), tmp_path / "out")
    assert "infmax_model_prefix" in err and "Qwen/Qwen3-32B" in err and "(and 3 more)" in err
    assert _export(tmp_path / "a", tmp_path / "out", "--allow-unmapped") == 0
    assert {r["infmax_model_prefix"] for r in _rows(tmp_path / "out")} == {None}
    # The config entry names the key.
    sweep(tmp_path / "b", SMALL, model="Qwen/Qwen3-32B", infmax_model_prefix="qwen3.5")
    assert _export(tmp_path / "b", tmp_path / "out-b") == 0
    assert {map_row(r).model for r in _rows(tmp_path / "out-b")} == {"qwen3.5"}


def test_a_runner_without_a_known_gpu_is_unmapped_hardware(tmp_path, capsys):
    sweep(tmp_path / "a", SMALL[:1], engine="vllm", image="vllm/vllm-openai:v1", runner="lab", hardware="")
    err = _one_line_exit_2(capsys, _export(tmp_path / "a", tmp_path / "out"), tmp_path / "out")
    assert "hw 'lab'" in err and "runners.yaml" in err


def test_no_cells_is_one_line_and_status_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    err = _one_line_exit_2(capsys, _export(tmp_path / "empty", tmp_path / "out"), tmp_path / "out")
    assert "no cell result directories" in err


def test_two_replayer_versions_are_refused_unless_allowed(tmp_path, capsys):
    paths = sweep(tmp_path / "a", SMALL)
    reseal(paths[1], replayer="9.9.9")
    err = capsys.readouterr().err + " "
    code = _export(tmp_path / "a", tmp_path / "out")
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "replayer versions differ" in err and "--allow-mixed" in err
    assert not (tmp_path / "out").exists()
    assert _export(tmp_path / "a", tmp_path / "out", "--allow-mixed") == 0
    assert len(_rows(tmp_path / "out")) == len(SMALL)


def test_rows_their_store_would_merge_are_refused(tmp_path, capsys):
    # Without receipts the off and noprefix cells have no recipe fingerprint to tell them apart.
    from ..collect.conftest import write_cell

    for spec in (Spec(tp=1, users=2, offload="off"), Spec(tp=1, users=2, offload="noprefix")):
        path = write_cell(tmp_path / "a", spec)
        doc = json.loads((path / "cell.json").read_text())
        doc["cell"]["model"] = "meta-llama/Llama-3.3-70B-Instruct"
        (path / "cell.json").write_text(json.dumps(doc))
    err = _one_line_exit_2(capsys, _export(tmp_path / "a", tmp_path / "out"), tmp_path / "out")
    assert "one point to InferenceX" in err


@pytest.mark.parametrize("target", ["rows.json", "full"])
def test_an_output_that_is_a_file_name_or_not_empty_is_refused(tmp_path, capsys, target):
    sweep(tmp_path / "a", SMALL[:1])
    out = tmp_path / target
    if target == "full":
        out.mkdir()
        (out / "keep").write_text("x")
    code = _export(tmp_path / "a", out)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and err.startswith("input error: ") and ("directory" in err or "not empty" in err)
    assert (out / "keep").read_text() == "x" if target == "full" else not out.exists()


def test_a_capacity_cell_exports_its_steps_not_itself(tmp_path, capsys):
    path = capacity_dir(tmp_path / "a")
    record = json.loads((path / "capacity.json").read_text())
    assert _export(tmp_path / "a", tmp_path / "out", "--allow-unmapped") == 0
    rows = _rows(tmp_path / "out")
    assert sorted((r["exp_name"], r["conc"]) for r in rows) == sorted(
        (s["exp_name"], s["users"]) for s in record["steps"]
    )
    assert all(r["p90_ttft"] is not None and r["tput_per_gpu"] > 0 for r in rows)
    err = capsys.readouterr().err
    assert "demo-tp1-ep1-u1to8-on: a capacity cell, not a point itself: its 6 steps are points" in err


def _break_receipt(kind: str, path: Path) -> str:
    """Make ``path`` depart from its receipt as ``kind`` says; what the row's reason then names."""
    if kind == "extra":
        (path / "notes.txt").write_text("added after the cell ended")
        return "does not match its receipt.json: notes.txt: extra"
    if kind == "missing":
        (path / "server_metrics.csv").unlink()
        return "does not match its receipt.json: server_metrics.csv: missing"
    if kind == "renamed":
        (path / "server_metrics.csv").rename(path / "server_metrics.old.csv")
        return "does not match its receipt.json: server_metrics.csv: missing"
    if kind == "changed":
        with (path / "requests.jsonl").open("a") as fh:
            fh.write("\n")
        return "does not match its receipt.json: requests.jsonl: changed"
    (path / "receipt.json").write_text("{ not json")
    return "receipt.json: not JSON"


@pytest.mark.parametrize("kind", ["extra", "missing", "renamed", "changed", "unreadable receipt"])
def test_a_cell_that_departs_from_its_receipt_is_not_exported(tmp_path, capsys, kind):
    paths = sweep(tmp_path / "a", SMALL)
    reason = _break_receipt(kind, paths[2])
    name = SMALL[2].exp_name
    assert _export(tmp_path / "a", tmp_path / "rows", "--include-invalid") == 0
    rows = _rows(tmp_path / "rows")
    assert sorted(r["exp_name"] for r in rows) == sorted(s.exp_name for s in SMALL if s.exp_name != name)
    assert f"export: {name}: MALFORMED, not exported" in capsys.readouterr().err
    # collect says the same of it, and why.
    assert main(["collect", str(tmp_path / "a"), str(tmp_path / "out"), "--no-plots"]) == 1
    table = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("exp_name")
    assert table.loc[name, "status"] == "MALFORMED" and reason in table.loc[name, "reason"]
    assert set(table.drop(name)["status"]) == {"SUCCESS"}


def test_a_point_without_receipt_beside_receipted_ones_is_refused_unless_allowed(tmp_path, capsys):
    paths = sweep(tmp_path / "a", SMALL)
    (paths[1] / "receipt.json").unlink()
    assert _export(tmp_path / "a", tmp_path / "rows") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--allow-mixed" in err
    assert f"1 point(s) without a receipt.json beside points with one ({SMALL[1].exp_name})" in err
    assert not (tmp_path / "rows").exists()
    assert _export(tmp_path / "a", tmp_path / "rows", "--allow-mixed") == 0
    assert len(_rows(tmp_path / "rows")) == len(SMALL)


def _only_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_an_output_that_is_a_fifo_a_device_or_a_link_is_refused_and_left_as_it_is(tmp_path, capsys):
    """The export writes a new directory: a FIFO, a device node or a link at -o is refused before any
    work and never replaced."""
    import os
    import stat

    sweep(tmp_path / "a", SMALL[:1])
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    assert _export(tmp_path / "a", fifo) == 2
    assert _only_line(capsys) == f"input error: {fifo}: exists and is not a directory"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    if os.geteuid() == 0:  # only root makes device nodes: /dev/null's twin
        device = tmp_path / "null"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        assert _export(tmp_path / "a", device) == 2
        assert "exists and is not a directory" in _only_line(capsys)
        assert stat.S_ISCHR(device.lstat().st_mode)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert _export(tmp_path / "a", link) == 2
    assert "exists and is not a directory" in _only_line(capsys)
    assert link.is_symlink() and not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary folder


def test_a_long_output_name_is_one_line(tmp_path, capsys):
    sweep(tmp_path / "a", SMALL[:1])
    long = tmp_path / ("x" * 300)
    assert _export(tmp_path / "a", long) == 2
    assert "cannot write" in _only_line(capsys)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".x", "x"))]
