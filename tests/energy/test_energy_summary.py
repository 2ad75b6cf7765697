"""The power summary: energy over the window checked by hand on a recorded H100 series, the figures per
token and request, and each fault turning ``power_valid`` false with one reason while the audit stays."""

from __future__ import annotations

import calendar
import itertools
import json
import time
from pathlib import Path

import pytest
from agentsweep.cell.record import write_result
from agentsweep.contract.cell import Cell
from agentsweep.energy.nvidia_smi import parse_line
from agentsweep.energy.powercsv import GpuReading, PowerCsvWriter, PowerRow, read_power
from agentsweep.energy.summary import (
    REASON_CODES,
    PowerLimit,
    Window,
    Work,
    cell_power_summary,
    integrate,
    power_limit,
    power_summary,
    summarize,
)
from agentsweep.engine_sim.profiles import HARDWARE
from kv_cache_tester.replay import load_summary

FIXTURES = Path(__file__).parent / "fixtures"
LOOP_FIELDS = (
    "timestamp", "index", "uuid", "power.draw", "power.draw.instant", "temperature.gpu",
    "utilization.gpu", "memory.used", "memory.total",
)  # fmt: skip


def stamp(text: str) -> float:
    head, _, frac = text.partition(".")
    return calendar.timegm(time.strptime(head, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)


def recorded(node: str = "h100") -> list[PowerRow]:
    """The recorded idle -> load -> idle series as power.csv rows."""
    rows = []
    for line in (FIXTURES / "nvidia-smi-loop-load.h100.csv").read_text().splitlines():
        when, r, _ = parse_line(line, LOOP_FIELDS)
        assert when is not None
        rows.append(
            PowerRow(stamp(when), node, r.gpu, r.power_w, r.energy_j, r.temp_c, r.util_pct, r.mem_used_mib)
        )
    return rows


T0 = stamp("2026/11/25 21:23:00.000")


def at(clock: str) -> float:
    """Unix time of 21:MM:SS.mmm on the recording's day."""
    return stamp(f"2026/11/25 21:{clock}")


def run(rows, start, end, *, gpus=1, interval=0.25, work=Work(), scale=1.0):  # type: ignore[no-untyped-def]
    return summarize(
        rows,
        window=Window(start, end, scale),
        expected_gpus=gpus,
        interval_s=interval,
        work=work,
        source="nvidia-smi",
    )


def test_energy_on_sample_edges_matches_the_hand_computation():
    # 23:52.148 235.70 W | 52.398 432.68 | 52.648 564.00 | 52.898 713.21 | 53.149 704.21 (trapezoids)
    hand = (
        0.250 * (235.70 + 432.68) / 2
        + 0.250 * (432.68 + 564.00) / 2
        + 0.250 * (564.00 + 713.21) / 2
        + 0.251 * (713.21 + 704.21) / 2
    )  # 545.66996 J
    summary = run(recorded(), at("23:52.148"), at("23:53.149"))
    assert summary.power_valid, summary.reasons
    assert summary.total_gpu_energy_j == pytest.approx(hand, abs=1e-3)  # Unix times in float64: ~0.1 us steps
    assert summary.total_gpu_energy_j == pytest.approx(545.66996, abs=1e-4)
    assert summary.audit.energy_from == "power integral" and summary.audit.samples == 5
    assert summary.avg_power_w == pytest.approx(hand / 1.001)


def test_energy_between_samples_interpolates_the_edges_by_hand():
    # Window 52.273 .. 53.024: the power at the start is halfway from 235.70 to 432.68 = 334.19 W; at
    # the end 0.126/0.251 of the way from 713.21 to 704.21 = 708.6921 W.
    start_w = 235.70 + (432.68 - 235.70) * 0.125 / 0.250
    end_w = 713.21 + (704.21 - 713.21) * 0.126 / 0.251
    hand = (
        0.125 * (start_w + 432.68) / 2
        + 0.250 * (432.68 + 564.00) / 2
        + 0.250 * (564.00 + 713.21) / 2
        + 0.126 * (713.21 + end_w) / 2
    )  # 421.74546 J
    summary = run(recorded(), at("23:52.273"), at("23:53.024"))
    assert summary.power_valid
    assert summary.total_gpu_energy_j == pytest.approx(hand, abs=1e-3)  # Unix times in float64: ~0.1 us steps
    assert summary.total_gpu_energy_j == pytest.approx(421.7455, abs=1e-3)


def test_the_whole_recording_idle_load_idle():
    rows = recorded()
    start, end = rows[0].time_s, rows[-1].time_s
    pairs = itertools.pairwise(rows)
    by_hand = sum((b.time_s - a.time_s) * ((a.power_w or 0) + (b.power_w or 0)) / 2 for a, b in pairs)
    summary = run(rows, start, end, work=Work(output_tokens=1000.0, total_tokens=5000.0, ok_requests=4.0))
    assert summary.power_valid, summary.reasons
    energy = summary.total_gpu_energy_j
    assert energy == pytest.approx(by_hand, rel=1e-12)
    # 5 s idle at 71 W, 3 s at 120 W (a context held), 15.8 s at ~700 W, 4.3 s at ~127 W: ~12.3 kJ
    assert 11_500 < energy < 13_000
    assert summary.joules_per_output_token == pytest.approx(energy / 1000)
    assert summary.joules_per_total_token == pytest.approx(energy / 5000)
    assert summary.joules_per_successful_query == pytest.approx(energy / 4)
    assert summary.peak_temp_c == 63.0 and summary.audit.observed_gpus == 1
    assert 690 < (summary.p90_power_w or 0) < 705  # most of the window at the 700 W limit
    assert summary.avg_util_pct == pytest.approx(sum(r.util_pct or 0 for r in rows) / len(rows))


def test_a_simulated_engines_clock_scales_an_integral_but_not_a_counter():
    rows = [PowerRow(100.0 + k, "n", "0", 200.0, 1000.0 + 200.0 * 50 * k) for k in range(11)]
    summary = run(rows, 100.0, 110.0, interval=1.0, scale=50.0)
    assert summary.audit.energy_from == "counter"
    assert summary.total_gpu_energy_j == pytest.approx(200.0 * 50 * 10)  # the counter counts engine time
    assert summary.avg_power_w == pytest.approx(200.0)
    no_counter = [PowerRow(r.time_s, r.node, r.gpu, r.power_w) for r in rows]
    summary = run(no_counter, 100.0, 110.0, interval=1.0, scale=50.0)
    assert summary.audit.energy_from == "power integral"
    assert summary.total_gpu_energy_j == pytest.approx(200.0 * 10 * 50)
    assert summary.avg_power_w == pytest.approx(200.0)


def test_counter_is_read_at_the_window_edges_by_interpolation():
    rows = [PowerRow(float(t), "n", "0", 100.0, 10.0 * t) for t in range(0, 11)]
    summary = run(rows, 2.5, 7.25, interval=1.0)
    assert summary.total_gpu_energy_j == pytest.approx(10.0 * (7.25 - 2.5))


def test_cell_figures_sum_gpus_on_every_node():
    rows = [
        PowerRow(float(t), node, gpu, w)
        for t in range(0, 11)
        for node, gpu, w in (("a", "0", 300.0), ("b", "0", 500.0))
    ]
    summary = run(rows, 0.0, 10.0, gpus=2, interval=1.0)
    assert summary.power_valid and summary.avg_power_w == pytest.approx(800.0)
    assert summary.avg_power_per_gpu_w == pytest.approx(400.0) and summary.p90_power_w == pytest.approx(800.0)
    assert {(g.node, g.gpu, g.avg_power_w) for g in summary.per_gpu} == {("a", "0", 300.0), ("b", "0", 500.0)}


def steady(gpus=("0", "1"), times=range(0, 21), node="n"):  # type: ignore[no-untyped-def]
    return [PowerRow(float(t), node, g, 400.0, None, 50.0, 90.0, 1000.0) for t in times for g in gpus]


def assert_withheld(summary, reason: str, code: str) -> None:  # type: ignore[no-untyped-def]
    """Withheld for ``reason`` (a part of one line), whose code is ``code`` (one code per line)."""
    assert not summary.power_valid
    assert any(reason in r for r in summary.reasons), summary.reasons
    assert len(summary.reason_codes) == len(summary.reasons)
    assert summary.reason_codes[next(i for i, r in enumerate(summary.reasons) if reason in r)] == code
    assert set(summary.reason_codes) <= set(REASON_CODES)
    for name in (
        "avg_power_w", "p90_power_w", "total_gpu_energy_j", "joules_per_output_token", "joules_per_total_token",
        "joules_per_successful_query", "avg_temp_c", "peak_temp_c", "avg_util_pct",
    ):  # fmt: skip
        assert getattr(summary, name) is None, name
    assert summary.audit.window_s is not None and summary.audit.expected_gpus >= 1


def test_a_gap_in_the_samples():
    rows = [r for r in steady() if not 8 < r.time_s < 14]
    summary = run(rows, 1.0, 19.0, gpus=2, interval=1.0)
    assert_withheld(
        summary, "largest gap between power samples is 6.00 s (GPU n/0; at most 5 s)", "sampling_gap_exceeded"
    )
    assert summary.audit.largest_gap_s == pytest.approx(6.0)


def test_a_gpu_that_disappears_part_way_with_the_samplers_fault():
    rows = [r for r in steady() if not (r.gpu == "1" and r.time_s > 9)]
    rows.append(
        PowerRow(
            12.5, "n", "1", fault="nvidia-smi on n: output line 40: GPU 1 reports power.draw as [GPU is lost]"
        )
    )
    summary = run(rows, 1.0, 19.0, gpus=2, interval=1.0)
    assert_withheld(summary, "[GPU is lost]", "sampler_fault")
    assert any("largest gap" in r and "GPU n/1" in r for r in summary.reasons)


def test_a_counter_that_goes_backwards():
    rows = [
        PowerRow(float(t), "n", "0", 400.0, 5000.0 + 400.0 * t - (4000.0 if t >= 12 else 0.0))
        for t in range(21)
    ]
    summary = run(rows, 1.0, 19.0, interval=1.0)
    assert_withheld(
        summary,
        "energy counter of GPU n/0 went backwards at +11.0 s of the window (9400 J -> 5800 J)",
        "negative_delta_gpus",
    )


def test_fewer_gpus_than_the_cell_has():
    summary = run(steady(gpus=("0",)), 1.0, 19.0, gpus=2, interval=1.0)
    assert_withheld(
        summary, "power samples of 1 of the cell's 2 GPUs in the window (n/0)", "expected_gpu_count_mismatch"
    )


def test_a_gpu_reporting_na_power():
    rows = steady(gpus=("0",)) + [PowerRow(float(t), "n", "1", None, None, 40.0) for t in range(21)]
    summary = run(rows, 1.0, 19.0, gpus=2, interval=1.0)
    assert_withheld(summary, "GPU n/1 reports no power", "no_usable_power_samples")


def test_a_missing_tool_leaves_only_its_fault_which_is_the_reason():
    rows = [PowerRow(0.2, "n", "", fault="nvidia-smi on n: cannot run nvidia-smi: No such file or directory")]
    summary = run(rows, 1.0, 19.0, gpus=1, interval=1.0)
    assert_withheld(summary, "cannot run nvidia-smi: No such file or directory", "sampler_fault")
    assert summary.audit.faults == 1 and summary.audit.observed_gpus == 0


def test_a_fault_outside_the_window_leaves_a_complete_measurement_valid():
    rows = [PowerRow(-30.0, "n", "", fault="dcgm on n: GET http://n:9400/metrics failed: refused"), *steady()]
    summary = run(rows, 1.0, 19.0, gpus=2, interval=1.0)
    assert summary.power_valid and summary.audit.faults == 1


def test_the_file_round_trips_and_the_result_directory_gives_the_summary(tmp_path):
    rd = tmp_path
    cell = Cell(
        exp_name="p-tp2-ep1-u2-off", engine="vllm", model="m", tp=2, users=2, offload="off", duration=60,
        traces="t", runner="h200", power_source="nvidia-smi", power_interval_s=1.0,
    )  # fmt: skip
    write_result(
        rd, cell=cell.model_dump(mode="json"), engine_command=["vllm"], engine_env={}, replay_command=["r"],
        versions={}, start_utc="2026-01-01T00:00:00Z", status="SUCCESS", reasons=(),
    )  # fmt: skip
    summary_json = {
        "schema_version": 1,
        "counts": {"sent": 10, "ok": 10, "failed": 0, "failed_by_class": {}, "warmup": 0},
        "window": {"start_unix": 1.0, "end_unix": 19.0, "duration_s": 18.0},
        "throughput": {
            "requests_per_s": 0.5,
            "input_tok_per_s": 900.0,
            "output_tok_per_s": 100.0,
            "total_tok_per_s": 1000.0,
        },
        "latency": {},
    }
    (rd / "summary.json").write_text(json.dumps(summary_json))
    with PowerCsvWriter(rd / "power.csv") as out:
        for r in steady():
            out.sample(
                r.time_s, r.node, GpuReading(r.gpu, r.power_w, None, r.temp_c, r.util_pct, r.mem_used_mib)
            )
    assert read_power(rd / "power.csv") == steady()
    summary = power_summary(rd)
    assert summary.power_valid, summary.reasons
    assert summary.total_gpu_energy_j == pytest.approx(2 * 400.0 * 18.0)
    assert summary.joules_per_output_token == pytest.approx(2 * 400.0 * 18.0 / (100.0 * 18.0))
    assert summary.joules_per_successful_query == pytest.approx(2 * 400.0 * 18.0 / 9.0)
    assert summary.audit.source == "nvidia-smi" and summary.to_dict()["audit"]["expected_gpus"] == 2
    # A reader that has read summary.json already (collect, from the cell's result) passes it on.
    read = load_summary(rd)
    (rd / "summary.json").rename(rd / "summary.kept.json")
    assert cell_power_summary(rd, cell, read) == summary
    missing = cell_power_summary(rd, cell)  # none given: read here, and gone
    assert not missing.power_valid and any("summary.json missing" in r for r in missing.reasons)
    (rd / "summary.kept.json").rename(rd / "summary.json")
    (rd / "power.csv").unlink()
    assert_withheld(power_summary(rd), "power.csv missing", "telemetry_file_missing")
    none = cell.replace(power_source="none").model_dump(mode="json")
    (rd / "cell.json").write_text(json.dumps({**json.loads((rd / "cell.json").read_text()), "cell": none}))
    assert_withheld(
        power_summary(rd), "runner h200 samples no power (power_source none)", "power_not_sampled"
    )


def test_unreadable_rows_are_counted_and_spoil_the_measurement(tmp_path):
    path = tmp_path / "power.csv"
    with PowerCsvWriter(path) as out:
        for r in steady(gpus=("0",)):
            out.sample(r.time_s, r.node, GpuReading(r.gpu, r.power_w))
    with path.open("a") as fh:
        fh.write("not,a,row\n" + "x" * 10_000 + "\n12,n,0,nan-ish,,,,,\n")
    rows = read_power(path)
    assert len(rows) == 22  # the third bad line parses: its power cell is text, so empty
    from agentsweep.energy.powercsv import PowerCsvReader

    reader = PowerCsvReader(path)
    list(reader)
    assert reader.bad_rows == 2 and reader.first_bad_line == 23


def test_integrate_is_zero_on_an_empty_or_reversed_window():
    assert integrate([], [], 0.0, 1.0) == 0.0
    assert integrate([0.0, 1.0], [5.0, 5.0], 1.0, 1.0) == 0.0
    assert integrate([0.0, 1.0], [5.0, 5.0], 0.0, 1.0) == pytest.approx(5.0)


def h200_rows() -> list[PowerRow]:
    rows = []
    for line in (FIXTURES / "nvidia-smi-loop-load.h200.csv").read_text().splitlines():
        when, r, _ = parse_line(line)
        assert when is not None
        rows.append(
            PowerRow(stamp(when), "h200", r.gpu, r.power_w, None, r.temp_c, r.util_pct, r.mem_used_mib)
        )
    return rows


def test_the_recorded_h200_plateau_and_a_hand_computed_stretch():
    rows = h200_rows()
    # 00:17:04.133 691.26 | 04.383 691.88 | 04.634 691.14 | 04.884 692.41 (trapezoids, by hand)
    hand = 0.250 * (691.26 + 691.88) / 2 + 0.251 * (691.88 + 691.14) / 2 + 0.250 * (691.14 + 692.41) / 2
    stretch = run(rows, stamp("2026/11/26 00:17:04.133"), stamp("2026/11/26 00:17:04.884"))
    assert stretch.power_valid and stretch.total_gpu_energy_j == pytest.approx(hand, abs=1e-3)
    plateau = run(rows, stamp("2026/11/26 00:17:04.0"), stamp("2026/11/26 00:17:22.9"))
    assert plateau.power_valid, plateau.reasons
    inside = [
        r.power_w or 0.0
        for r in rows
        if stamp("2026/11/26 00:17:04.0") <= r.time_s <= stamp("2026/11/26 00:17:22.9")
    ]
    assert plateau.avg_power_w == pytest.approx(sum(inside) / len(inside), rel=0.002)
    assert (
        688 < (plateau.avg_power_w or 0) < 695
        and plateau.peak_temp_c == 64.0
        and plateau.avg_util_pct == 100.0
    )


def test_the_writer_never_writes_a_non_finite_figure(tmp_path):
    with PowerCsvWriter(tmp_path / "power.csv") as out:
        out.sample(1.0, "n", GpuReading("0", float("nan"), float("inf"), 40.0))
    (row,) = read_power(tmp_path / "power.csv")
    assert row.power_w is None and row.energy_j is None and row.temp_c == 40.0
    assert "nan" not in (tmp_path / "power.csv").read_text().lower()


# --- figures beyond what the hardware can draw ------------------------------------------------------


def test_the_power_limit_is_a_multiple_of_the_board_power():
    assert power_limit("h200") == PowerLimit(1050.0, "1.5 x h200's 700 W board power")
    assert power_limit("mi355x").watts == 2100.0
    unknown = power_limit("")
    assert unknown.watts == 1.5 * max(h.board_power_w for h in HARDWARE.values())
    assert unknown.basis == "1.5 x the largest board power known, 1400 W (hardware not named)"


def test_power_read_a_thousand_times_too_large_is_not_a_measurement():
    """Two GPUs whose power column is in mW, read as W: about 415 kW each, withheld with the reason."""
    rows = [PowerRow(100.0 + k / 2, "n", gpu, 415_195.0 + k, None) for k in range(21) for gpu in ("0", "1")]
    summary = summarize(
        rows, window=Window(100.0, 110.0), expected_gpus=2, interval_s=0.5, work=Work(), source="dcgm",
        limit=power_limit("h200"),
    )  # fmt: skip
    assert not summary.power_valid and summary.avg_power_w is None and summary.total_gpu_energy_j is None
    assert summary.reasons == (
        "GPU n/0 reads 415195 W at +0.0 s of the window, outside 0..1050 W (1.5 x h200's 700 W board "
        "power): not a measurement",
        "GPU n/1 reads 415195 W at +0.0 s of the window, outside 0..1050 W (1.5 x h200's 700 W board "
        "power): not a measurement",
    )
    assert summary.reason_codes == ("power_out_of_range", "power_out_of_range")  # one per reason
    # The same figures in watts are a measurement.
    fine = [PowerRow(r.time_s, r.node, r.gpu, (r.power_w or 0) / 1000, None) for r in rows]
    valid = summarize(
        fine, window=Window(100.0, 110.0), expected_gpus=2, interval_s=0.5, work=Work(), source="dcgm",
        limit=power_limit("h200"),
    )  # fmt: skip
    assert valid.power_valid, valid.reasons
    assert valid.avg_power_w == pytest.approx(2 * 415.2, rel=1e-3)


def test_an_energy_counter_in_the_wrong_unit_shows_in_its_average():
    """Power in range, the energy counter 1000 times too fast (mJ read as J): the counter's average says so."""
    rows = [PowerRow(100.0 + k, "n", "0", 300.0, 1e6 + 300_000.0 * k) for k in range(11)]
    summary = run(rows, 100.0, 110.0, interval=1.0)
    assert not summary.power_valid
    assert summary.reasons == (
        "GPU n/0 averages 300000 W over the window (counter), outside 0..2100 W (1.5 x the largest board "
        "power known, 1400 W (hardware not named)): not a measurement",
    )
    negative = [PowerRow(100.0 + k, "n", "0", -5.0 if k == 4 else 300.0, None) for k in range(11)]
    assert run(negative, 100.0, 110.0, interval=1.0).reasons[0].startswith("GPU n/0 reads -5 W at +4.0 s")


def test_a_recorded_gpu_at_its_limit_stays_valid():
    rows = recorded()
    summary = summarize(
        rows, window=Window(rows[0].time_s, rows[-1].time_s), expected_gpus=1, interval_s=0.25, work=Work(),
        source="nvidia-smi", limit=power_limit("h200"),
    )  # fmt: skip
    assert summary.power_valid, summary.reasons  # up to 713 W against 1050 W


def test_a_power_summary_window_that_is_not_a_number_is_one_line(capsys):
    from agentsweep.cli import main

    for flags in (["--start", "nan", "--end", "nan"], ["--start", "1", "--end", "inf"]):
        with pytest.raises(SystemExit) as stop:
            main(["power-summary", "--power-csv", "power.csv", *flags])
        assert stop.value.code == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "must be a finite time in Unix seconds" in err[0], err
