"""The issue's case end to end: a runner named b300 on runners/launch_local.sh (through
$AGENTSWEEP_RUNNERS) runs the B300 profile, and every reader names it "simulated B300"."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.cli import main
from agentsweep.store import query
from agentsweep.store.db import Store

pytestmark = pytest.mark.slow

RUNNERS = textwrap.dedent(
    """\
    b300:
      runs_on: [self-hosted]
      launcher: runners/launch_local.sh
      gpus_per_node: 8
      cpu_dram_gb: 64
      container_runtime: none
    """
)
CONFIG = textwrap.dedent(
    """\
    hw:
      runner: b300
      engine: sim
      model: meta-llama/Llama-3.3-70B-Instruct
      precision: fp8
      duration: 4
      speed: 50
      traces: {traces}
      engine_args: [--hardware, b300, --num-gpu-blocks-override, "4096"]
      replay:
        max_context: 65536
        max_delay: 1
        warmup_requests: 0
      validity:
        min_window_coverage: 0.5
        max_dispatch_lag_p99_s: 2.0
      search_space:
        tp1: {{users: [2], offload: [off]}}
    """
)
EXP = "hw-tp1-ep1-u2-off"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("b300")
    (tmp / "runners.yaml").write_text(RUNNERS)
    (tmp / "sweep.yaml").write_text(CONFIG.format(traces=REPO_ROOT / "kv-cache-tester" / "sample_traces"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENTSWEEP_RUNNERS", str(tmp / "runners.yaml"))
        sweep = [
            "sweep",
            "--key",
            "hw",
            "--config",
            str(tmp / "sweep.yaml"),
            "--results",
            str(tmp / "results"),
        ]
        rc = main([*sweep, "--no-plots"])  # the report's tables are checked, not its figures
    assert rc in (0, 3), rc  # every cell ran (3: one was INVALID on a busy machine; not what is checked)
    return tmp / "results" / "hw"


def test_the_cell_and_the_engine_run_the_b300_profile(results: Path) -> None:
    record = json.loads((results / EXP / "cell.json").read_text())
    assert record["cell"]["node"]["hardware"] == "b300" and record["hardware"] == "simulated B300"
    argv = record["engine_command"]
    assert argv.count("--hardware") == 2 and {
        argv[i + 1] for i, a in enumerate(argv) if a == "--hardware"
    } == {"b300"}
    log = (results / EXP / "server.log").read_text()
    assert "[engine_sim] simulated B300, vllm engine: " in log and " hardware=b300 " in log
    assert '"hardware": "b300"' in log  # the effective settings the cell checks against its label
    assert (
        "calibration b300/fp8: no published point; extrapolated with the fractions fitted on b200/fp8" in log
    )


def test_summary_report_export_and_store_name_simulated_b300(results: Path, tmp_path: Path) -> None:
    table = pd.read_csv(results / "aggregated" / "summary.csv").set_index("exp_name")
    assert (table.loc[EXP, "hardware"], table.loc[EXP, "hardware_label"]) == ("b300", "simulated B300")
    report = (results / "aggregated" / "report.html").read_text()
    assert "<td>simulated B300</td>" in report
    out = tmp_path / "rows"
    assert main(["export", "--format", "inferencex", str(results), "-o", str(out), "--include-invalid"]) == 0
    (row,) = json.loads((out / "results_bmk" / "agg_bmk.json").read_text())
    assert (row["hw"], row["simulated"], row["framework"]) == ("b300-sim", True, "sim")
    db = tmp_path / "store.db"
    assert main(["results", "ingest", "--db", str(db), str(results)]) == 0
    with Store.open(str(db)).read() as conn:
        (point,) = query.load_points(conn)
    assert point.scope["hardware"] == "simulated B300"
