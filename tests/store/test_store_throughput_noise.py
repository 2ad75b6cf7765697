"""Throughput has a noise figure of its own: its value ± 2 standard errors over the measurement
window's sub-windows (the tokens of the requests that finished in each). `results diff --check` so
fails a 20 % throughput drop of the same cells and passes a rerun within that noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentsweep.cli import main

from ..collect.conftest import Spec, requests_lines
from .conftest import make_sweep, scale_summary, seal

SPECS = [Spec(tp=1, users=8, offload="on"), Spec(tp=2, users=8, offload="off")]
RECORDS = 400


def _steady(path: Path, jitter: float = 0.0) -> None:
    """A cell with 400 requests spread evenly (one a second) and a window in requests.jsonl's clock,
    its summary's counts kept true to them; ``jitter`` varies each request's output tokens."""
    spec_users = json.loads((path / "cell.json").read_text())["cell"]["users"]
    lines, sent, failed = [], 0, 0
    for i, line in enumerate(requests_lines(Spec(users=spec_users), n=RECORDS)):
        rec = json.loads(line)
        rec["t_done"] = rec["t_dispatch"] + (rec["e2e_s"] or 1.0)
        if rec["status"] == "ok":
            rec["output_tokens"] = int(200 * (1 + jitter * ((i % 7) - 3) / 3))
        if rec["phase"] == "profile":
            sent += 1
            failed += rec["status"] != "ok"
        lines.append(json.dumps(rec))
    (path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    summary = json.loads((path / "summary.json").read_text())
    summary["counts"].update(
        sent=sent, ok=sent - failed, failed=failed, failed_by_class={"ReadTimeout": failed}
    )
    summary["window"].update(start_s=20.0, end_s=380.0)
    (path / "summary.json").write_text(json.dumps(summary))


def _run(root: Path, start: str, throughput: float = 1.0, jitter: float = 0.0) -> Path:
    for path in make_sweep(root, SPECS, start_utc=start):
        _steady(path, jitter)
        if throughput != 1.0:
            scale_summary(path, throughput=throughput)
        seal(path)
    return root


def _diff(db: str, capsys: pytest.CaptureFixture[str], base: str, head: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["results", "diff", base, head, "--db", db, "--check", "--metric", "output_tok_per_s_per_gpu",
                 "--metric", "total_tok_per_s_per_gpu"])  # fmt: skip
    return code, capsys.readouterr().out


def test_a_20_percent_throughput_drop_fails_the_check_and_a_rerun_within_noise_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTSWEEP_INGEST_WORKERS", "1")
    base = _run(tmp_path / "base", "2026-01-01T00:00:00Z")
    rerun = _run(tmp_path / "rerun", "2026-01-02T00:00:00Z", throughput=1.01, jitter=0.05)
    drop = _run(tmp_path / "drop", "2026-01-02T00:00:00Z", throughput=0.8)
    # Two stores of two runs each: no repeats to lean on, the sub-windows alone judge.
    for name, head in (("rerun", rerun), ("drop", drop)):
        db = f"sqlite:///{tmp_path / name}.db"
        for label, root in (("base", base), (name, head)):
            assert main(["results", "ingest", "--db", db, str(root), "--label", label]) == 0
    code, out = _diff(f"sqlite:///{tmp_path / 'rerun'}.db", capsys, "base", "rerun")
    assert code == 0, out
    assert out.count("within noise") == 4 and "(sub-windows)" in out and "not judged" not in out
    code, out = _diff(f"sqlite:///{tmp_path / 'drop'}.db", capsys, "base", "drop")
    assert code == 1, out
    assert out.count("CHANGED worse") == 4 and "-20.0%" in out and "(sub-windows)" in out


def test_a_window_of_few_subwindows_or_without_its_run_clock_bounds_gives_no_throughput_noise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTSWEEP_INGEST_WORKERS", "1")
    db = f"sqlite:///{tmp_path / 'store.db'}"
    for label, throughput, start in (("a", 1.0, "2026-01-01T00:00:00Z"), ("b", 0.5, "2026-01-02T00:00:00Z")):
        make_sweep(tmp_path / label, SPECS[:1], throughput=throughput, start_utc=start)  # no start_s/end_s
        assert main(["results", "ingest", "--db", db, str(tmp_path / label), "--label", label]) == 0
    code, out = _diff(db, capsys, "a", "b")
    assert code == 0 and out.count("not judged") == 2 and "no noise figure" in out


def test_a_point_invalid_in_the_head_is_named_so_and_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ..dashboard.conftest import make_invalid

    monkeypatch.setenv("AGENTSWEEP_INGEST_WORKERS", "1")
    db = f"sqlite:///{tmp_path / 'store.db'}"
    _run(tmp_path / "base", "2026-01-01T00:00:00Z")
    head = _run(tmp_path / "head", "2026-01-02T00:00:00Z")
    invalid = next(head.glob(f"agentic_{SPECS[0].exp_name}"))
    make_invalid(invalid)
    seal(invalid)
    for label in ("base", "head"):
        assert main(["results", "ingest", "--db", db, str(tmp_path / label), "--label", label]) == 0
    code, out = _diff(db, capsys, "base", "head")
    assert code == 1, out
    assert "INVALID in head" in out and "throughput_drift" in out and "only in base" not in out
