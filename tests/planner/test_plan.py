"""`agentsweep plan`: capacity searches on the virtual clock per simulated hardware, one table, figure
and page with each figure's calibration; a finished search is kept when the plan runs again; bad
input is one line and exit status 2."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import wait_until

pytestmark = pytest.mark.slow

ARGS = ["--hardware", "h200,b300", "--search", "1:4", "--duration", "6", "--max-context", "24576"]


def plan(repo_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTSWEEP_REPLAY_PLOT"}
    return subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "plan", *args],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_a_plan_answers_per_tier_and_hardware_and_keeps_finished_searches(
    repo_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "plan"
    first = plan(repo_root, *ARGS, "-o", str(out))
    assert first.returncode == 0, first.stderr[-3000:]
    with open(out / "plan.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["hardware"], r["tier"]) for r in rows} == {
        (h, t) for h in ("simulated H200", "simulated B300") for t in ("interactive", "fast", "realtime")
    }
    for row in rows:
        assert row["calibration"].startswith("calibration ")
        assert float(row["band"]) > 0  # the held-out error of the calibration it rests on
        assert row["agents_per_gpu"] != "" and 0 <= float(row["agents_per_gpu"]) <= 4
    b300 = next(r for r in rows if r["hardware"] == "simulated B300")
    assert "extrapolated with the fractions fitted on b200" in b300["calibration"]
    page = (out / "plan.html").read_text()
    assert "data:image/png;base64," in page and "simulated B300" in page and "<table>" in page
    assert (out / "plan.png").stat().st_size > 10_000
    assert "simulated H200 TP 1 offload off, tier interactive:" in first.stdout
    for name in ("plan-h200-tp1-ep1-u1to4-off", "plan-b300-tp1-ep1-u1to4-off"):  # each a capacity cell
        assert (out / "cells" / name / "capacity.json").exists()
        assert not list((out / "cells" / name).glob("steps/*/ttft_throughput.png"))

    # Its searches are result directories like any cell's: the store takes them.
    ingest = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "results", "ingest", "--db", str(tmp_path / "r.db"), str(out / "cells")],
        cwd=repo_root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ingest.returncode == 0 and "points added" in ingest.stderr, ingest.stderr

    again = plan(repo_root, *ARGS, "-o", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("finished before, kept") == 2
    assert again.stdout == first.stdout  # the same answer from the same searches


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hardware", "h200,h300"], "--hardware h300: no simulated profile of it"),
        (["--tp", "two"], "--tp: 'two' is not a positive integer"),
        (["--replicas", "0"], "--replicas 0: expected a positive number of engines"),
        (
            ["--search", "64:128"],
            "--search 64:128: kv-cache-tester/sample_traces gives 17 traces at --max-context 65536, and a "
            "trace is never live in two lanes",
        ),
        (["--replicas", "2", "--router", "cache_aware"], "--router cache_aware: the virtual clock routes by"),
        (
            ["--search", "1:64", "--budget-min", "0.1"],
            "--budget-min 0.1: 5 searches of 1..64 users take about",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    repo_root: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    proc = plan(repo_root, *args, "-o", str(tmp_path / "p"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "p").exists()


def test_a_plan_of_replicas_behind_a_router_counts_every_gpu(repo_root: Path, tmp_path: Path) -> None:
    """A rack-shaped plan: each search runs its engines behind the in-process router (session
    affinity by default), and agents per GPU count the GPUs of every replica."""
    out = tmp_path / "plan"
    args = ["--hardware", "gb300", "--replicas", "2", "--search", "2:8", "--duration", "6"]
    done = plan(
        repo_root, *args, "--max-context", "24576", "--slo", "loose: ttft p90 <= 60 s", "-o", str(out)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = list(csv.DictReader((out / "plan.csv").open(newline="")))
    assert (row["hardware"], row["tp"], row["replicas"]) == ("simulated GB300", "1", "2")
    (search,) = (out / "cells").iterdir()
    assert search.name.endswith("-r2-consistent_hash")
    capacity = json.loads((search / "capacity.json").read_text())
    (tier,) = capacity["tiers"]
    assert float(row["agents_per_gpu"]) == tier["boundary_users"] / 2  # two engines of one GPU each
    routed = [json.loads(p.read_text()) for p in search.glob("steps/*/router.json")]
    assert routed and all(r["program"] == "in-process" and r["policy"] == "consistent_hash" for r in routed)
    assert "simulated GB300 2 x TP 1 (2 GPUs) offload off, tier loose:" in done.stdout


@pytest.mark.chromium
def test_the_plan_page_opens_offline_with_its_figure_and_table(tmp_path: Path) -> None:
    from agentsweep.planner.report import PlanRow, write_plan

    from tests.dashboard.browser import offline_page

    rows = [
        PlanRow(hardware=f"simulated {h}", tp=1, replicas=1, offload="off", tier=t, tier_description=t, agents_per_gpu=a,
                agents_per_mw=a * 2000 if a else None, boundary_type="exact", binding="TTFT p90",
                past_kv_cliff=h == "H200", output_tok_per_s_per_gpu=10.0 * a, total_tok_per_s_per_gpu=900.0,
                band=0.05, calibration=f"calibration {h.lower()}/fp8: fitted to 5 published points",
                exp_name=f"plan-{h.lower()}")
        for h, a0 in (("H200", 2.0), ("B300", 6.0)) for t, a in (("interactive", a0), ("fast", a0 / 2))
    ]  # fmt: skip
    write_plan(rows, tmp_path, "a plan")
    with offline_page() as (page, errors, network):
        page.goto((tmp_path / "plan.html").as_uri())
        width = page.eval_on_selector("img", "img => img.naturalWidth")
        cells = page.eval_on_selector_all(
            "tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
        )
        assert errors == [] and network == []
    assert width > 600  # the inlined figure decoded
    assert [c[:3] + c[4:6] for c in cells] == [  # hardware, TP, replicas, tier, agents per GPU
        ["simulated H200", "1", "1", "interactive", "2.0"], ["simulated H200", "1", "1", "fast", "1.0"],
        ["simulated B300", "1", "1", "interactive", "6.0"], ["simulated B300", "1", "1", "fast", "3.0"],
    ]  # fmt: skip
    assert cells[0][8] == "past it" and cells[0][11] == "±5%"


def test_an_interrupted_plan_keeps_every_finished_search(repo_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    env = {k: v for k, v in os.environ.items() if k != "AGENTSWEEP_REPLAY_PLOT"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", "plan", *ARGS, "--hardware", "h200,b200,b300", "-o", str(out)],
        cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    first = out / "cells" / "plan-h200-tp1-ep1-u1to4-off" / "status.txt"
    wait_until(
        lambda: first.exists() or proc.poll() is not None, timeout=120, what="the first search's verdict"
    )
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]  # two more searches of seconds each were left to run
    assert "the finished searches are kept" in err
    assert first.read_text().startswith("SUCCESS")
    again = plan(repo_root, *ARGS, "--hardware", "h200,b200,b300", "-o", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "plan-h200-tp1-ep1-u1to4-off: finished before, kept" in again.stderr
    with open(out / "plan.csv", newline="") as fh:
        assert len({row["hardware"] for row in csv.DictReader(fh)}) == 3
