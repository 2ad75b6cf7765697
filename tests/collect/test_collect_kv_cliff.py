"""The KV-capacity cliff: the users' working set against the engine's KV pool, flagged per cell."""

from __future__ import annotations

from agentsweep.collect.aggregate import build_rows, to_frame
from agentsweep.collect.discover import find_cells
from agentsweep.collect.kv_cliff import cliff_columns
from agentsweep.contract.resultdir.serverlog import kv_pool_tokens


def test_the_pool_is_read_from_either_engine_start_up_log(tmp_path):
    vllm = tmp_path / "vllm.log"
    vllm.write_text("INFO x\nINFO 11-23 [kv_cache_utils.py] GPU KV cache size: 159,600 tokens\nlater\n")
    sglang = tmp_path / "sglang.log"
    sglang.write_text("[2026-01-01] KV Cache is allocated. #tokens: 524288, K size: 30.00 GB\n")
    nothing = tmp_path / "none.log"
    nothing.write_text("no pool here\n")
    assert kv_pool_tokens(vllm) == 159_600
    assert kv_pool_tokens(sglang) == 524_288
    assert kv_pool_tokens(nothing) is None and kv_pool_tokens(tmp_path / "missing.log") is None


def test_the_flag_compares_working_set_and_pool():
    assert cliff_columns(200_000, 159_600)["past_kv_cliff"] is True
    assert cliff_columns(100_000, 159_600)["past_kv_cliff"] is False
    assert cliff_columns(None, 159_600)["past_kv_cliff"] is None


def test_collect_flags_the_cells_past_the_cliff(tmp_path, cell_factory, spec_cls):
    small, large = spec_cls(tp=1, users=8, offload="off"), spec_cls(tp=2, users=8, offload="off")
    for spec, pool in ((small, 3_000), (large, 1_000_000)):
        path = cell_factory(tmp_path, spec)
        (path / "server.log").write_text(f"INFO GPU KV cache size: {pool:,} tokens\n")
    df = to_frame(build_rows(find_cells(tmp_path))).set_index("exp_name")
    # 8 lanes each held a 1,000-token prompt and up to 200 output tokens: 9,600 tokens live.
    assert df.loc[small.exp_name, "kv_working_set_tokens"] == 9_600
    assert df.loc[small.exp_name, "past_kv_cliff"] == 1 and df.loc[large.exp_name, "past_kv_cliff"] == 0
    assert df.loc[small.exp_name, "kv_pool_tokens"] == 3_000
