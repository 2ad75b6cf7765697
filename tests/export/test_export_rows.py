"""The two row shapes: shipped schemas equal the generated ones, rows validate, nested flattens to flat."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agentsweep.contract.cell import Cell
from agentsweep.export.build import Point, flat_row, nested_row
from agentsweep.export.models import flatten
from agentsweep.export.schema import SCHEMA_DIR, SCHEMA_FILES, generated, problems, render, shipped


def _cell(**extra: Any) -> Cell:
    fields: dict[str, Any] = {
        "exp_name": "x-tp2-u4-on",
        "engine": "sim",
        "model": "m",
        "precision": "fp8",
        "image": "img:1",
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
    for stat in ("mean", "p50", "p75", "p90", "p95", "p99", "p999", "std"):
        values[f"interactivity_{stat}_tok_per_s"] = 1 / values[f"full_response_itl_{stat}_s"]
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
        server_prompt_tok_per_s=900.0,
        server_generation_tok_per_s=100.0,
        requests_ok=40,
        requests_sent=42,
        requests_failed=2,
        requests_warmup=4,
        req_records=46,
        failed_by_class='{"timeout":2}',
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
POWER_FIGURES = {
    "avg_power_w": 1200.0,
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


def _power_values(*, valid: bool, reasons: tuple[str, ...] = ()) -> dict[str, Any]:
    """collect's power columns of a cell (every figure empty while power is invalid)."""
    return {
        "power_valid": valid,
        **{name: value if valid else None for name, value in POWER_FIGURES.items()},
        "power_reasons": json.dumps(list(reasons)),
        "power_audit": json.dumps(AUDIT, sort_keys=True, separators=(",", ":")),
    }


def _powered(**extra: Any) -> Cell:
    """A cell of a runner that samples power (the local runner's facts)."""
    return _cell(power_source="dcgm", power_endpoint="engine", **extra)


def _point(cell: Cell | None = None, outcome: str = "SUCCESS", **values: Any) -> Point:
    return Point("x", outcome, cell or _cell(), {**_values(), **values}, {"router": None})  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", ["flat", "nested"])
def test_the_shipped_schema_is_the_one_the_models_generate(shape) -> None:
    assert shipped(shape) == generated(shape), "run `python -m agentsweep.export.schema`"
    assert (SCHEMA_DIR / SCHEMA_FILES[shape]).read_text() == render(generated(shape))


@pytest.mark.parametrize(
    ("cell", "power"),
    [
        (_cell(), {}),
        (_cell(offload="noprefix"), {}),
        (_cell(tp=1, prefill={"tp": 1}, decode={"replicas": 2, "tp": 1}, router="round_robin", gpus=3), {}),
        (_powered(), {}),
        (_powered(), _power_values(valid=False, reasons=("a gap of 12.0 s in GPU 0's samples",))),
    ],
    ids=["one-engine", "noprefix", "disaggregated", "with-power", "power-withheld"],
)
def test_a_nested_row_flattens_to_the_flat_row_and_both_validate(cell, power) -> None:
    point = _point(cell, **power)
    nested = nested_row(point).model_dump(mode="json", by_alias=True)
    flat = flat_row(point).model_dump(mode="json", by_alias=True)
    assert problems(nested, "nested") == []
    assert problems(flat, "flat") == []
    assert flatten(nested_row(point)).model_dump(mode="json", by_alias=True) == flat
    assert json.dumps(flat, allow_nan=False)


def test_flat_keys_are_inferencex_names_and_agentic_rows_use_the_full_response_itl() -> None:
    flat = flat_row(_point()).model_dump(mode="json", by_alias=True)
    values = _values()
    assert flat["median_itl"] == values["full_response_itl_p50_s"]
    assert flat["p99.9_intvty"] == pytest.approx(1 / values["full_response_itl_p999_s"])
    assert flat["tput_per_gpu"] == 500.0 and flat["conc"] == 4 and flat["num_gpus"] == 2
    assert flat["offload_mode"] == "on" and flat["dp_attention"] == "false"
    assert flat["duration_seconds"] == 20.0  # the window in the engine's clock
    assert flat["total_prompt_tokens"] == 18000  # 900 tok/s over 20 s
    nested = nested_row(_point()).model_dump(mode="json", by_alias=True)
    latency = nested["request_metrics"]["latency"]
    assert latency["itl"]["p50"] == values["itl_p50_s"]  # the plain ITL beside the full-response one
    assert latency["intvty"]["p90"] == pytest.approx(1 / values["itl_p90_s"])
    assert nested["request_accounting"]["error_categories"] == {"timeout": 2}
    assert nested["server_metrics"]["cache"]["overall_cache_hit_rate"] == pytest.approx(0.45)


def test_noprefix_is_offload_off_without_prefix_caching_and_disagg_rows_name_their_roles() -> None:
    flat = flat_row(_point(_cell(offload="noprefix"))).model_dump(by_alias=True)
    assert flat["offload_mode"] == "off" and flat["prefix_caching"] == "false"
    assert flat["allocated_cpu_dram_gb"] == 0.0 and flat["kv_offload_backend"] == "none"
    cell = _cell(tp=1, prefill={"tp": 1}, decode={"replicas": 2, "tp": 1}, router="round_robin", gpus=3)
    flat = flat_row(_point(cell)).model_dump(by_alias=True)
    assert flat["disagg"] is True and flat["num_gpus"] == 3
    assert (flat["num_prefill_gpu"], flat["decode_num_workers"], flat["num_decode_gpu"]) == (1, 2, 2)


def test_a_row_that_breaks_the_schema_is_named_field_by_field() -> None:
    flat = flat_row(_point()).model_dump(mode="json", by_alias=True)
    flat["conc"] = "four"
    del flat["tput_per_gpu"]
    found = problems(flat, "flat")
    assert any(line.startswith("conc:") for line in found)
    assert any("tput_per_gpu" in line for line in found)


def test_power_is_collects_columns_in_both_shapes() -> None:
    flat = flat_row(_point(_powered())).model_dump(mode="json", by_alias=True)
    nested = nested_row(_point(_powered())).model_dump(mode="json", by_alias=True)["power"]
    assert flat["power_valid"] is True and nested["valid"] is True
    for name in (
        "avg_power_w",
        "total_gpu_energy_j",
        "joules_per_output_token",
        "joules_per_total_token",
        "joules_per_successful_query",
        "avg_temp_c",
        "peak_temp_c",
        "avg_util_pct",
    ):
        assert flat[name] == nested[name] == POWER_FIGURES[name], name
    assert flat["power_reasons"] == nested["reasons"] == []
    assert flat["power_audit"] == nested["audit"] == AUDIT
    assert "p90_power_w" not in flat and "p90_power_w" not in nested


def test_withheld_power_keeps_its_reasons_and_audit_and_no_sampling_is_null() -> None:
    reasons = ("GPUs: 1 of 2 reported samples in the window", "a gap of 12.0 s in GPU 0's samples")
    withheld = _point(_powered(), **_power_values(valid=False, reasons=reasons))
    flat = flat_row(withheld).model_dump(mode="json", by_alias=True)
    assert flat["power_valid"] is False and flat["power_reasons"] == list(reasons)
    assert flat["avg_power_w"] is None and flat["joules_per_output_token"] is None
    assert flat["power_audit"] == AUDIT and flat["outcome"] == "SUCCESS"  # the point itself stands
    assert nested_row(withheld).model_dump(mode="json", by_alias=True)["power"]["reasons"] == list(reasons)
    # A runner with power_source none: collect says "samples no power"; the export says null.
    none = _point(_cell(), **_power_values(valid=False, reasons=("runner x samples no power",)))
    flat = flat_row(none).model_dump(mode="json", by_alias=True)
    assert flat["power_valid"] is None and flat["power_reasons"] is None and flat["power_audit"] is None
    assert flat["joules_per_output_token"] is None
    assert nested_row(none).model_dump(mode="json", by_alias=True)["power"] is None
    assert problems(flat, "flat") == []
