"""Power columns in summary.csv (from the one power summary) and the energy panel; a cell whose power is
withheld keeps its status and every other figure."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from agentsweep.collect.aggregate import build_rows, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.collect.plots import energy_figure
from agentsweep.energy.powercsv import GpuReading, PowerCsvWriter

from .conftest import WINDOW_START

WATTS = 300.0


def add_power(cell_dir: Path, *, gpus: int, speed: float, gap: tuple[float, float] | None = None) -> None:
    """Make the cell a power-sampling one and give it one 300 W sample per second per GPU (and the
    counter a simulated engine keeps: engine seconds x watts)."""
    record = json.loads((cell_dir / "cell.json").read_text())
    record["cell"].update(power_source="dcgm", power_endpoint="engine", power_interval_s=1.0)
    (cell_dir / "cell.json").write_text(json.dumps(record))
    duration = record["cell"]["duration"]
    with PowerCsvWriter(cell_dir / "power.csv") as out:
        for k in range(-5, int(duration) + 6):
            t = WINDOW_START + k
            if gap and gap[0] < k < gap[1]:
                continue
            for g in range(gpus):
                energy = 1e6 + WATTS * (k + 5) * speed
                out.sample(t, "n1", GpuReading(str(g), WATTS, energy, 55.0, 80.0, 100_000.0))


def frame(root: Path) -> pd.DataFrame:
    return to_frame(build_rows(find_cells(root)))


def test_power_columns_of_a_cell(tmp_path, cell_factory, spec_cls):
    spec = spec_cls(tp=2, users=8, offload="on")
    add_power(cell_factory(tmp_path, spec), gpus=2, speed=1.0)
    row = frame(tmp_path).iloc[0]
    assert row["status"] == "SUCCESS" and row["power_valid"] == 1.0
    energy = 2 * WATTS * spec.duration
    assert row["total_gpu_energy_j"] == pytest.approx(energy)
    assert row["avg_power_w"] == pytest.approx(2 * WATTS) and row["avg_power_per_gpu_w"] == pytest.approx(
        WATTS
    )
    assert row["joules_per_output_token"] == pytest.approx(energy / (spec.output_tok_per_s() * spec.duration))
    assert row["joules_per_total_token"] == pytest.approx(
        energy / ((spec.output_tok_per_s() + spec.input_tok_per_s()) * spec.duration)
    )
    assert row["joules_per_successful_query"] == pytest.approx(energy / (2.0 * spec.duration))
    assert row["avg_temp_c"] == 55.0 and row["peak_temp_c"] == 55.0 and row["avg_util_pct"] == 80.0
    assert json.loads(row["power_reasons"]) == []
    audit = json.loads(row["power_audit"])
    assert audit["expected_gpus"] == audit["observed_gpus"] == 2 and audit["energy_from"] == "counter"


def test_the_power_figures_take_the_summary_collect_read(tmp_path, cell_factory, spec_cls, monkeypatch):
    spec = spec_cls(tp=2, users=8, offload="on")
    add_power(cell_factory(tmp_path, spec), gpus=2, speed=1.0)

    def read_again(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("summary.json read a second time")

    monkeypatch.setattr("agentsweep.energy.summary.load_summary", read_again)
    row = frame(tmp_path).iloc[0]
    assert row["status"] == "SUCCESS" and row["power_valid"] == 1.0
    assert row["total_gpu_energy_j"] == pytest.approx(2 * WATTS * spec.duration)


def test_figures_in_the_engines_clock_are_not_rescaled(tmp_path, cell_factory, spec_cls):
    """A simulated engine 20x faster: its counter counts engine seconds, so the energy per token is the
    same figure and the power the same watts, while its rates are divided by 20."""
    add_power(cell_factory(tmp_path / "wall", spec_cls(tp=1)), gpus=1, speed=1.0)
    add_power(cell_factory(tmp_path / "fast", spec_cls(tp=1, speed=20.0)), gpus=1, speed=20.0)
    wall, fast = frame(tmp_path / "wall").iloc[0], frame(tmp_path / "fast").iloc[0]
    assert fast["avg_power_w"] == pytest.approx(wall["avg_power_w"]) == pytest.approx(WATTS)
    assert fast["total_gpu_energy_j"] == pytest.approx(20 * wall["total_gpu_energy_j"])
    # 20x the energy for the same tokens over a window that is 20x longer in the engine's clock
    assert fast["joules_per_output_token"] == pytest.approx(20 * wall["joules_per_output_token"])
    assert fast["output_tok_per_s"] == pytest.approx(wall["output_tok_per_s"] / 20)


def test_withheld_power_is_a_note_and_changes_nothing_else(tmp_path, cell_factory, spec_cls):
    spec = spec_cls(tp=1, users=4, offload="off")
    plain = frame_of(tmp_path / "plain", cell_factory, spec)
    add_power(cell_factory(tmp_path / "gap", spec), gpus=1, speed=1.0, gap=(10, 30))
    row = frame(tmp_path / "gap").iloc[0]
    assert row["status"] == "SUCCESS" and row["power_valid"] == 0.0
    reasons = json.loads(row["power_reasons"])
    assert reasons == ["largest gap between power samples is 20.00 s (GPU n1/0; at most 5 s)"]
    assert pd.isna(row["joules_per_output_token"]) and pd.isna(row["avg_power_w"])
    assert "power figures withheld: largest gap" in row["notes"]
    for column in ("output_tok_per_s_per_gpu", "ttft_p50_s", "interactivity_p50_tok_per_s", "gpu_hit_rate"):
        assert row[column] == plain[column], column


def frame_of(root: Path, cell_factory, spec) -> pd.Series:  # type: ignore[no-untyped-def]
    cell_factory(root, spec)
    return frame(root).iloc[0]


@pytest.mark.slow
def test_energy_panel_only_with_power_figures(tmp_path, cell_factory, spec_cls):
    for users in (2, 8, 32):
        add_power(cell_factory(tmp_path / "sweep", spec_cls(tp=1, users=users)), gpus=1, speed=1.0)
    df = frame(tmp_path / "sweep")
    assert energy_figure(df, tmp_path / "energy.png") == tmp_path / "energy.png"
    assert (tmp_path / "energy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bare = frame_of(tmp_path / "bare", cell_factory, spec_cls(tp=1, users=2))
    assert energy_figure(pd.DataFrame([bare]), tmp_path / "none.png") is None  # no power source: no panel
