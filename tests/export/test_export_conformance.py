"""Conformance: an export, both shapes, read as InferenceX reads it. Every row maps, each to a point of
its own, and each mapped figure equals the one in its cell's own files (conformance.check_export).

The quick test exports result directories built from the collect and store fixtures (ordinary cells in
every offload mode, a replicated and a disaggregated cell, one INVALID); the slow one a real local sweep
of the simulated engine (docs/export.md, "Conformance")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agentsweep.cli import main
from agentsweep.contract.verdict import INVALID_EXIT
from agentsweep.energy.summary import power_summary

from .conformance import check_export
from .sweeps import ORDINARY, sweep

REPO_ROOT = Path(__file__).resolve().parents[2]


def _cells(paths: list[Path]) -> dict[str, Path]:
    """exp_name -> result directory."""
    return {json.loads((p / "cell.json").read_text())["cell"]["exp_name"]: p for p in paths}


@pytest.mark.parametrize("shape", ["flat", "nested"])
def test_every_row_of_a_sweep_maps_with_its_own_figures(tmp_path, shape):
    invalid = ORDINARY[4].exp_name
    paths = sweep(tmp_path / "a", invalid=[invalid], routed=True, disaggregated=True)
    cells = _cells(paths)
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "a"), "-o", str(out), "--shape", shape, "--include-invalid"]) == 0
    mapped = check_export(out, cells)
    assert len(mapped) == len(cells) - 1  # all but the INVALID cell
    # Every offload mode of one TP and user count is a point of its own (noprefix is not off's).
    keys = {mapped[s.exp_name].key() for s in ORDINARY if (s.tp, s.users) == (2, 8)}
    assert len(keys) == 3


# --- a real local sweep: the routed cells on the wall clock, the others on the virtual one ----------

CONFIG = """
conf: &sim
  runner: local
  engine: sim
  model: meta-llama/Llama-3.3-70B-Instruct
  precision: fp8
  image: ""
  duration: 6
  speed: 50
  traces: {traces}
  engine_args: [--num-gpu-blocks-override, "16000"]
  replay: {{max_context: 65536, max_delay: 1, advance_max: 0.5}}
  validity: {{min_window_coverage: 0.5, max_dispatch_lag_p99_s: 2.0, max_throughput_drift: 5.0, max_lane_idle_s: 120}}
  search_space:
    - {{tp: 1, users: 4, offload: off, replicas: 2, router: [round_robin]}}
    - {{users: 4, offload: off, prefill: {{tp: 1}}, decode: {{tp: 1}}, router: [round_robin]}}
conf-virtual:
  <<: *sim
  clock: virtual
  validity: {{min_window_coverage: 0.5, max_throughput_drift: 5.0, max_lane_idle_s: 120}}
  search_space:
    - {{tp: 1, users: 4, offload: [on, off, noprefix]}}
conf-invalid:
  <<: *sim
  clock: virtual
  engine_args: []
  replay: {{max_context: 65536, max_delay: 1}}
  validity: {{min_window_requests: 100000}}
  search_space:
    - {{tp: 2, users: 2, offload: off}}
"""


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    config = root / "conf.yaml"
    config.write_text(CONFIG.format(traces=REPO_ROOT / "kv-cache-tester" / "sample_traces"))
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSWEEP_CELL", "PORT", "RESULT_DIR")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the cells' python
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "sweep", "--key", "conf", "--key", "conf-virtual", "--key", "conf-invalid",
         "--config", str(config), "--results", str(root / "results"), "--no-collect"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == INVALID_EXIT, proc.stdout[-3000:] + proc.stderr[-3000:]  # one cell INVALID
    return root / "results"


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["flat", "nested"])
def test_a_real_local_sweep_exports_rows_that_all_map_with_their_figures(real_sweep, tmp_path, shape):
    cells = _cells([c.parent for c in real_sweep.rglob("cell.json")])
    statuses = {n: (p / "status.txt").read_text().split("\n", 1)[0] for n, p in cells.items()}
    assert list(statuses.values()).count("INVALID") >= 1 and list(statuses.values()).count("SUCCESS") == 5, (
        statuses
    )
    out = tmp_path / "out"
    assert main(["export", str(real_sweep), "-o", str(out), "--shape", shape, "--include-invalid"]) == 0
    mapped = check_export(out, cells)
    assert len(mapped) == 5
    for name, point in mapped.items():
        # The local runner samples the simulated GPUs' power: schema 2, per GPU.
        power = power_summary(cells[name])
        assert point.metrics["power_metric_schema_version"] == 2.0
        assert point.metrics["power_valid"] == (1.0 if power.power_valid else 0.0), name
        if power.power_valid:
            assert point.metrics["avg_power_w"] == pytest.approx(power.avg_power_per_gpu_w, rel=1e-9)
            assert point.metrics["avg_total_gpu_power_w"] == pytest.approx(power.avg_power_w, rel=1e-9)
            assert point.metrics["joules_per_output_token"] == pytest.approx(
                power.joules_per_output_token, rel=1e-9
            )
        assert point.hardware == "h200" and point.framework == "sim"
