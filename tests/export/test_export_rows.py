"""The two row shapes: shipped schemas equal the generated ones, rows validate, nested flattens to flat,
and both shapes map through InferenceX's ingest (restated in inferencex_ingest.py) to the same point
with the same figures."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agentsweep.collect.aggregate import Row
from agentsweep.collect.power import power_columns
from agentsweep.contract.cell import Cell
from agentsweep.energy.summary import PowerAudit, PowerSummary
from agentsweep.export.build import Point, flat_row, nested_row
from agentsweep.export.models import flatten, row_json
from agentsweep.export.schema import SCHEMA_DIR, SCHEMA_FILES, generated, problems, render, shipped

from .inferencex_ingest import Skipped, map_row


def _cell(**extra: Any) -> Cell:
    fields: dict[str, Any] = {
        "exp_name": "x-tp2-u4-on",
        "engine": "sim",
        "model": "meta-llama/Llama-3.3-70B-Instruct",
        "precision": "fp8",
        "image": "",
        "duration": 60,
        "traces": "t",
        "tp": 2,
        "users": 4,
        "offload": "on",
        "cpu_dram_gb": 100,
    }
    fields.update(extra)
    return Cell.parse(fields)


def _values() -> dict[str, Any]:
    values: dict[str, Any] = {"window_s": 10.0, "clock_scale": 2.0, "recipe_fingerprint": "ab" * 32}
    for i, metric in enumerate(("ttft", "e2e", "itl", "tpot", "full_response_itl")):
        for j, stat in enumerate(("mean", "p50", "p75", "p90", "p95", "p99", "p999", "std")):
            values[f"{metric}_{stat}_s"] = 0.01 * (i + 1) * (j + 1)
    for stat in ("mean", "p50", "p75", "p90", "p95", "p99", "p999"):
        values[f"interactivity_{stat}_tok_per_s"] = 1 / values[f"full_response_itl_{stat}_s"]
    values["interactivity_std_tok_per_s"] = 7.5
    for j, stat in enumerate(("mean", "p50", "p75", "p90", "p95", "p99", "p999", "std")):
        values[f"e2e_norm_interactivity_{stat}_tok_per_s"] = 20.0 - j
    values.update(
        input_tok_per_s=900.0,
        output_tok_per_s=100.0,
        total_tok_per_s=1000.0,
        input_tok_per_s_per_gpu=450.0,
        output_tok_per_s_per_gpu=50.0,
        total_tok_per_s_per_gpu=500.0,
        theoretical_hit_rate=0.5,
        gpu_hit_rate=0.4,
        cpu_hit_rate=0.05,
        kv_usage_mean=0.3,
        kv_usage_peak=0.83,
        server_prompt_tok_per_s=900.0,
        server_generation_tok_per_s=100.0,
        requests_ok=40,
        requests_sent=42,
        requests_failed=2,
        requests_warmup=4,
        req_records=46,
        failed_by_class='{"timeout":2}',
        preset_deviations="[]",
        kv_pool_tokens=160000,
        stability_subwindow_s=3.0,
        stability_expected_window_count=3,
        stability_observed_window_count=3,
        stability_root_trajectory_count=7,
        stability_root_trajectory_kish_effective_count=5.5,
        stability_root_trajectory_largest_share=0.25,
    )
    for stat in ("p75", "p90"):
        for key in ("ttft", "e2el", "intvty"):
            values[f"stability_{stat}_{key}_min"] = 1.0
            values[f"stability_{stat}_{key}_max"] = 2.0
    values.update(_power_values(valid=True))
    return values


AUDIT: dict[str, Any] = {
    "source": "dcgm (simulated engine)",
    "window_start_unix": 1000.0,
    "window_end_unix": 1010.0,
    "window_s": 10.0,
    "clock_scale": 2.0,
    "expected_gpus": 2,
    "observed_gpus": 2,
    "samples": 42,
    "largest_gap_s": 0.5,
    "largest_gap_gpu": "0",
    "max_gap_s": 2.5,
    "energy_from": "counter",
    "faults": 0,
    "bad_rows": 0,
}
POWER = {
    "avg_power_w": 1200.0,  # collect's: the whole cell
    "p90_power_w": 1300.0,
    "avg_power_per_gpu_w": 600.0,
    "total_gpu_energy_j": 24000.0,
    "joules_per_output_token": 12.0,
    "joules_per_total_token": 1.2,
    "joules_per_successful_query": 600.0,
    "avg_temp_c": 55.0,
    "peak_temp_c": 61.0,
    "avg_util_pct": 80.0,
}


def _power_summary(*, valid: bool, reasons: tuple[tuple[str, str], ...] = ()) -> PowerSummary:
    """A cell's power summary (every figure empty while power is invalid)."""
    return PowerSummary(
        power_valid=valid,
        **{name: value if valid else None for name, value in POWER.items()},
        reasons=tuple(text for _, text in reasons),
        audit=PowerAudit(**AUDIT),
        reason_codes=tuple(code for code, _ in reasons),
    )


def _power_values(*, valid: bool, reasons: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """collect's power columns of a cell, and the summary they render (``power``)."""
    power = _power_summary(valid=valid, reasons=reasons)
    figures, _ = power_columns(power, _powered())
    return {**figures, "power": power}


def _powered(**extra: Any) -> Cell:
    """A cell of a runner that samples power (the local runner's facts)."""
    return _cell(power_source="dcgm", power_endpoint="engine", **extra)


def _point(
    cell: Cell | None = None,
    outcome: str = "SUCCESS",
    reason: str = "",
    deviations: tuple[str, ...] = (),
    **values: Any,
) -> Point:
    figures = {**_values(), **values}
    power = figures.pop("power")
    labels = {"recipe_fingerprint": figures.pop("recipe_fingerprint")}
    row = Row("x", outcome, reason, labels=labels, figures=figures, power=power)
    return Point(row, cell or _cell(), {"router": None}, {"timeout": 2}, deviations=deviations)


DISAGG = {"tp": 1, "prefill": {"tp": 1}, "decode": {"replicas": 2, "tp": 1}, "router": "round_robin"}
GAP = ("sampling_gap_exceeded", "largest gap between power samples is 12.00 s (GPU 0; at most 2.5 s)")


@pytest.mark.parametrize("shape", ["flat", "nested"])
def test_the_shipped_schema_is_the_one_the_models_generate(shape) -> None:
    assert shipped(shape) == generated(shape), "run `python -m agentsweep.export.schema`"
    assert (SCHEMA_DIR / SCHEMA_FILES[shape]).read_text() == render(generated(shape))


CASES = [
    (_cell(), {}),
    (_cell(offload="noprefix"), {}),
    (_cell(**DISAGG), {}),
    (_powered(), {}),
    (_powered(), _power_values(valid=False, reasons=(GAP,))),
]
IDS = ["one-engine", "noprefix", "disaggregated", "with-power", "power-withheld"]


@pytest.mark.parametrize(("cell", "power"), CASES, ids=IDS)
def test_a_nested_row_flattens_to_the_flat_row_and_both_validate(cell, power) -> None:
    point = _point(cell, **power)
    nested = row_json(nested_row(point))
    flat = row_json(flat_row(point))
    assert problems(nested, "nested") == []
    assert problems(flat, "flat") == []
    assert row_json(flatten(nested_row(point))) == flat
    assert json.dumps(flat, allow_nan=False)


@pytest.mark.parametrize(("cell", "power"), CASES, ids=IDS)
def test_both_shapes_map_to_one_point_with_the_same_figures_through_their_ingest(cell, power) -> None:
    point = _point(cell, **power)
    flat, nested = map_row(row_json(flat_row(point))), map_row(row_json(nested_row(point)))
    assert flat.key() == nested.key()
    shared = set(flat.metrics) & set(nested.metrics)
    for key in (
        "median_ttft",
        "p90_itl",
        "p90_intvty",
        "std_intvty",
        "tput_per_gpu",
        "gpu_kv_cache_usage_pct",
    ):
        assert key in shared, key
    assert {k: flat.metrics[k] for k in shared} == {k: nested.metrics[k] for k in shared}
    # What the nested row's latency gives their flattener is the full-response interactivity too.
    assert nested.metrics["p90_intvty"] == pytest.approx(1 / _values()["full_response_itl_p90_s"])


def test_flat_keys_are_inferencex_names_and_agentic_rows_use_the_full_response_itl() -> None:
    flat = row_json(flat_row(_point()))
    values = _values()
    assert flat["median_itl"] == flat["median_full_response_itl"] == values["full_response_itl_p50_s"]
    assert flat["p99.9_intvty"] == pytest.approx(1 / values["full_response_itl_p999_s"])
    assert flat["tput_per_gpu"] == 500.0 and flat["conc"] == flat["users"] == 4 and flat["num_gpus"] == 2
    assert flat["offload_mode"] == "on" and flat["dp_attention"] == "false"
    assert flat["duration_seconds"] == 20.0  # the window in the engine's clock
    assert flat["total_prompt_tokens"] == 18000  # 900 tok/s over 20 s
    assert flat["observed_window_seconds"] == 6.0 and flat["observed_window_expected_count"] == 3
    nested = row_json(nested_row(_point()))
    latency = nested["request_metrics"]["latency"]
    assert latency["token_gap_itl"]["p50"] == values["itl_p50_s"]  # the token gaps beside the full ITL
    assert latency["token_gap_intvty"]["p90"] == pytest.approx(1 / values["itl_p90_s"])
    assert latency["itl"] == latency["full_response_itl"]
    assert nested["request_accounting"]["error_categories"] == {"timeout": 2}
    assert nested["server_metrics"]["cache"]["overall_cache_hit_rate"] == pytest.approx(0.45)
    assert nested["request_metrics"]["throughput"]["duration_seconds"] == 20.0


def test_kv_usage_is_the_peak_fraction_of_the_window() -> None:
    flat = row_json(flat_row(_point()))
    assert flat["gpu_kv_cache_usage_pct"] == 0.83  # kv_usage_peak, not the mean 0.3, not x 100
    assert map_row(flat).metrics["gpu_kv_cache_usage_pct"] == 0.83


def test_the_model_key_comes_from_the_shipped_map_or_the_config_entry() -> None:
    assert row_json(flat_row(_point()))["infmax_model_prefix"] == "llama70b"
    other = _cell(model="Qwen/Qwen3-32B")
    assert row_json(flat_row(_point(other)))["infmax_model_prefix"] is None
    with pytest.raises(Skipped, match="unmappedModel"):
        map_row(row_json(flat_row(_point(other))))
    named = _cell(model="Qwen/Qwen3-32B", infmax_model_prefix="qwen3.5")
    assert map_row(row_json(flat_row(_point(named)))).model == "qwen3.5"


def test_a_simulated_cell_never_reads_as_measured_hardware() -> None:
    sim = map_row(row_json(flat_row(_point())))
    real = map_row(
        row_json(flat_row(_point(_cell(engine="vllm", image="vllm/vllm-openai:v1", hardware="h200"))))
    )
    assert sim.hardware == real.hardware == "h200"
    assert sim.framework == "sim" and real.framework == "vllm"
    assert sim.key() != real.key()
    assert sim.metrics["simulated"] == 1.0 and real.metrics["simulated"] == 0.0
    assert row_json(flat_row(_point()))["hw"] == "h200-sim"


def test_only_a_disaggregated_cell_carries_role_keys_and_tp2_reads_as_tp2() -> None:
    one = row_json(flat_row(_point()))
    assert not any(key.startswith(("prefill_", "decode_", "num_prefill", "num_decode")) for key in one)
    topo = map_row(one).topology
    assert (topo.disagg, topo.prefill_tp, topo.decode_tp, topo.num_decode_gpu) == (False, 2, 2, 2)
    pd = map_row(row_json(flat_row(_point(_cell(**DISAGG))))).topology
    assert pd.disagg is True and (pd.prefill_tp, pd.num_prefill_gpu) == (1, 1)
    assert (pd.decode_tp, pd.decode_workers, pd.num_decode_gpu) == (1, 2, 2)


def test_noprefix_is_offload_off_and_a_point_of_its_own_by_its_recipe() -> None:
    off = _point(_cell(offload="off"), recipe_fingerprint="aa" * 32)
    noprefix = _point(_cell(offload="noprefix"), recipe_fingerprint="bb" * 32)
    rows = [row_json(flat_row(p)) for p in (off, noprefix)]
    assert rows[1]["offload_mode"] == "off" and rows[1]["prefix_caching"] == "false"
    assert rows[1]["allocated_cpu_dram_gb"] == 0.0 and rows[1]["kv_offload_backend"] == "none"
    a, b = (map_row(r) for r in rows)
    assert a.offload_mode == b.offload_mode == "off" and a.key() != b.key()


def test_power_is_their_schema_2_per_gpu_with_codes() -> None:
    flat = row_json(flat_row(_point(_powered())))
    assert flat["power_metric_schema_version"] == 2 and flat["power_valid"] == 1
    assert flat["avg_power_w"] == 600.0 and flat["avg_total_gpu_power_w"] == 1200.0
    assert flat["p90_power_w"] == 650.0 and flat["p90_total_gpu_power_w"] == 1300.0
    assert flat["power_invalid_reasons"] == []
    assert flat["power_audit"]["expected_gpu_count"] == 2 and flat["power_audit"]["source"] == "power.csv"
    mapped = map_row(flat)
    assert mapped.metrics["power_valid"] == 1.0 and mapped.metrics["power_metric_schema_version"] == 2.0
    assert mapped.metrics["avg_power_w"] == 600.0 and mapped.metrics["joules_per_output_token"] == 12.0
    assert mapped.power_audit is not None and mapped.power_audit["sample_count"] == 42


def test_withheld_power_is_zero_with_its_codes_and_no_sampling_has_no_power_keys() -> None:
    withheld = row_json(flat_row(_point(_powered(), **_power_values(valid=False, reasons=(GAP,)))))
    assert withheld["power_valid"] == 0 and "avg_power_w" not in withheld
    assert withheld["power_invalid_reasons"] == ["sampling_gap_exceeded"]
    assert withheld["power_audit"]["reasons"] == [GAP[1]]
    mapped = map_row(withheld)
    assert mapped.metrics["power_valid"] == 0.0 and "joules_per_output_token" not in mapped.metrics
    assert mapped.power_invalid_reasons == ["sampling_gap_exceeded"]
    # A runner with power_source none: no power key at all (their ingest reads no verdict).
    none = row_json(flat_row(_point(_cell())))
    assert not any(key.startswith("power_") or key.startswith("joules_") for key in none)
    assert "power_valid" not in map_row(none).metrics
    assert problems(none, "flat") == []


def test_an_invalid_cell_is_a_failed_benchmark_outcome_their_ingest_leaves_out() -> None:
    row = row_json(flat_row(_point(outcome="INVALID", reason="dispatch lag p99 3.1 s > 2 s; collect: x")))
    assert row["benchmark_outcome"] == {
        "status": "failed",
        "verdict": "INVALID",
        "reasons": ["dispatch lag p99 3.1 s > 2 s", "collect: x"],
        "failed_requests": 2,
    }
    with pytest.raises(Skipped, match="failedRun"):
        map_row(row)
    assert row_json(flat_row(_point()))["benchmark_outcome"]["status"] == "passed"


def test_a_row_that_breaks_the_schema_is_named_field_by_field() -> None:
    flat = row_json(flat_row(_point()))
    flat["conc"] = "four"
    del flat["tput_per_gpu"]
    found = problems(flat, "flat")
    assert any(line.startswith("conc:") for line in found)
    assert any("tput_per_gpu" in line for line in found)


def test_a_run_that_departs_from_its_preset_says_so_by_name_in_its_row() -> None:
    cell = _cell(preset="agentx", duration=900)
    departs = ["test_duration 900 (InferenceX 3600)"]
    for model in (flat_row, nested_row):
        row = row_json(model(_point(cell, deviations=tuple(departs))))
        assert row["replay_preset"] == {"name": "agentx", "deviations": departs}
    plain = row_json(flat_row(_point()))
    assert plain["replay_preset"] == {"name": "none", "deviations": []}


def test_e2e_normalised_interactivity_is_a_field_of_both_shapes() -> None:
    flat = row_json(flat_row(_point()))
    nested = row_json(nested_row(_point()))
    assert (
        flat["p90_e2e_norm_intvty"] == nested["request_metrics"]["latency"]["e2e_norm_intvty"]["p90"] == 17.0
    )
    assert flat["median_e2e_norm_intvty"] == 19.0 and flat["std_e2e_norm_intvty"] == 13.0
    # Their ingest keeps it as a metric of its own (their flattener reads no such block: the flat key).
    assert map_row(flat).metrics["p90_e2e_norm_intvty"] == 17.0
