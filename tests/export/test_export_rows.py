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
    return values


def _point(cell: Cell | None = None, outcome: str = "SUCCESS") -> Point:
    return Point("x", outcome, cell or _cell(), _values(), {"router": None})  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", ["flat", "nested"])
def test_the_shipped_schema_is_the_one_the_models_generate(shape) -> None:
    assert shipped(shape) == generated(shape), "run `python -m agentsweep.export.schema`"
    assert (SCHEMA_DIR / SCHEMA_FILES[shape]).read_text() == render(generated(shape))


@pytest.mark.parametrize(
    "cell",
    [
        _cell(),
        _cell(offload="noprefix"),
        _cell(tp=1, prefill={"tp": 1}, decode={"replicas": 2, "tp": 1}, router="round_robin", gpus=3),
    ],
    ids=["one-engine", "noprefix", "disaggregated"],
)
def test_a_nested_row_flattens_to_the_flat_row_and_both_validate(cell) -> None:
    point = _point(cell)
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
