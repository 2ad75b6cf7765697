"""Model shapes derived from config.json against the figures the model cards state."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from agentsweep.engine_sim.model_config import SHIPPED_DIR, load_shape, profile_key, shipped_models
from agentsweep.engine_sim.profiles import HARDWARE, deploy, find_model
from agentsweep.errors import InputError

# Model cards: total and activated parameters (billions), as each card states them. Cards count the
# multi-token-prediction layers out; the derivation counts the input embedding out of the active
# figure (a lookup, no FLOPs), which the gpt-oss card does too.
CARD_PARAMS: dict[str, tuple[float, float | None]] = {
    "deepseek-ai/DeepSeek-R1": (671, 37),
    "moonshotai/Kimi-K2-Instruct": (1000, 32),  # "1 trillion total, 32 billion activated"
    "Qwen/Qwen3.5-397B-A17B": (397, 17),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": (235, 22),
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": (480, 35),
    "zai-org/GLM-4.6": (355, 32),
    "openai/gpt-oss-120b": (116.83, 5.13),
    "openai/gpt-oss-20b": (20.91, 3.61),
    "meta-llama/Llama-3.3-70B-Instruct": (70.6, None),  # dense: every weight but the input embedding
    "meta-llama/Llama-3.1-8B-Instruct": (8.03, None),
    "deepseek-ai/DeepSeek-V3.2": (671, 37),
    "MiniMaxAI/MiniMax-M2": (230, 10),  # "230 billion total parameters with 10 billion active"
}

# KV bytes per token at BF16 over the whole model, from the cards' architecture tables:
# layers keeping a full cache x (2 x KV heads x head dim, or the MLA latent 512 + 64) x 2 bytes.
CARD_KV_BYTES = {
    "deepseek-ai/DeepSeek-R1": 61 * 576 * 2,  # MLA: 68.6 KB per token
    "moonshotai/Kimi-K2-Instruct": 61 * 576 * 2,
    "meta-llama/Llama-3.3-70B-Instruct": 80 * 2 * 8 * 128 * 2,  # 320 KiB per token
    "meta-llama/Llama-3.1-8B-Instruct": 32 * 2 * 8 * 128 * 2,  # 128 KiB per token
    "Qwen/Qwen3.5-397B-A17B": 15 * 2 * 2 * 256 * 2,  # 15 of 60 layers are full attention
    "Qwen/Qwen3-235B-A22B-Instruct-2507": 94 * 2 * 4 * 128 * 2,
    "zai-org/GLM-4.6": 92 * 2 * 8 * 128 * 2,
    # 18 of 36 layers are full attention (the rest: a 128-token window)
    "openai/gpt-oss-120b": 18 * 2 * 8 * 64 * 2,
    "MiniMaxAI/MiniMax-M2": 62 * 2 * 8 * 128 * 2,
    "Qwen/Qwen3-Coder-Next": 12 * 2 * 2 * 256 * 2,  # 12 of 48 layers are full attention, the rest linear
}


@pytest.mark.parametrize("name", sorted(CARD_PARAMS))
def test_parameter_counts_match_the_model_cards(name: str) -> None:
    shape = load_shape(name)
    assert shape is not None
    total, active = CARD_PARAMS[name]
    assert shape.total_params / 1e9 == pytest.approx(total, rel=0.03)
    if active is None:
        embedding = 128256 * (8192 if "70B" in name else 4096)
        assert shape.active_params == shape.total_params - embedding
    else:
        assert shape.active_params / 1e9 == pytest.approx(active, rel=0.05)


@pytest.mark.parametrize("name", sorted(CARD_KV_BYTES))
def test_kv_bytes_per_token_match_the_model_cards(name: str) -> None:
    dep = deploy(name, "b200", 1)
    assert dep.kv_bytes_per_token_gpu == CARD_KV_BYTES[name]
    assert deploy(name, "b200", 1, kv_cache_dtype="fp8").kv_bytes_per_token_gpu == CARD_KV_BYTES[name] // 2


def test_every_shipped_config_is_understood_in_full() -> None:
    names = shipped_models()
    assert len(names) >= 15
    for name in names:
        shape = load_shape(name)
        assert shape is not None and shape.source.endswith("shipped with agentsweep"), name
        assert shape.unused_fields == (), (name, shape.unused_fields)
    # every model of the sweep configs and of the calibration data has its config
    for name in ("nvidia/DeepSeek-R1-0528-FP4-V2", "amd/DeepSeek-R1-0528-MXFP4-Preview", "deepseek-ai/DeepSeek-R1",
                 "nvidia/Llama-3.3-70B-Instruct-FP8", "Qwen/Qwen3.5-397B-A17B-FP8", "meta-llama/Llama-3.3-70B-Instruct"):  # fmt: skip
        assert name in names


def test_moe_layout_and_native_precision() -> None:
    r1 = load_shape("deepseek-ai/DeepSeek-R1")
    assert r1 is not None
    assert (r1.experts, r1.experts_per_token, r1.moe_layers, r1.mla_dim, r1.layers) == (256, 8, 58, 576, 61)
    assert (r1.native_precision, r1.max_model_len) == ("fp8", 163840)
    fp4 = load_shape("nvidia/DeepSeek-R1-0528-FP4-V2")
    assert fp4 is not None and (fp4.native_precision, fp4.dense_precision) == ("fp4", "fp8")
    assert find_model("amd/DeepSeek-R1-0528-MXFP4-Preview").native_precision == "fp4"
    oss = find_model("openai/gpt-oss-120b")
    assert (oss.native_precision, oss.dense_precision, oss.layers, oss.all_layers) == ("fp4", "bf16", 18, 36)
    qwen = find_model("Qwen/Qwen3.5-397B-A17B-FP8")
    assert (qwen.native_precision, qwen.layers, qwen.all_layers, qwen.experts) == ("fp8", 15, 60, 512)
    llama = find_model("meta-llama/Llama-3.3-70B-Instruct")
    assert (llama.experts, llama.native_precision, llama.routed_expert_params) == (0, "bf16", 0.0)


def test_profile_keys() -> None:
    assert profile_key("nvidia/DeepSeek-R1-0528-FP4-V2") == "deepseek-r1"
    assert profile_key("deepseek-ai/DeepSeek-V3-0324") == "deepseek-v3"
    assert profile_key("Qwen/Qwen3-235B-A22B-Instruct-2507") == "qwen3-235b-a22b"
    assert profile_key("/models/models--zai-org--GLM-4.6") == "glm-4.6"
    # a name without a config of its own borrows the shipped one of the same model
    assert find_model("meta-llama/Llama-3.3-70B-Instruct-FP8").key == "llama-3.3-70b"


def _local_copy(tmp_path: Path, name: str) -> Path:
    """A Hugging Face cache layout holding one shipped config and a safetensors index."""
    snap = tmp_path / f"models--{name.replace('/', '--')}" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    shutil.copy(SHIPPED_DIR / name / "config.json", snap / "config.json")
    return snap


def test_a_local_directory_works_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snap = _local_copy(tmp_path, "zai-org/GLM-4.6")
    index = {"metadata": {"total_size": 714_000_000_000}, "weight_map": {}}
    (snap / "model.safetensors.index.json").write_text(json.dumps(index))
    for where in (snap, snap.parent.parent):  # the snapshot, or the cache's repository folder
        shape = find_model(str(where))
        assert shape.key == "glm-4.6" and str(snap) in shape.source
        assert shape.checkpoint_bytes == 714e9
    dep = deploy(str(snap), "b300", 8)
    assert dep.weight_bytes_gpu == pytest.approx(714e9 / 8)


def test_unknown_fields_are_named_and_bad_values_are_one_line(tmp_path: Path) -> None:
    snap = _local_copy(tmp_path, "meta-llama/Llama-3.1-8B-Instruct")
    config = json.loads((snap / "config.json").read_text())
    config["attention_sink_tokens"] = 4
    (snap / "config.json").write_text(json.dumps(config))
    assert find_model(str(snap)).unused_fields == ("attention_sink_tokens",)
    del config["attention_sink_tokens"]
    # What the derivation cannot represent is refused by name, not guessed.
    config |= {"index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64}
    (snap / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        InputError, match="index_topk: a sparse-attention indexer is modelled only beside MLA"
    ):
        find_model(str(snap))
    for key in ("index_topk", "index_head_dim", "index_n_heads"):
        del config[key]
    config["layer_types"] = ["sliding_attention", "full_attention"] * 16
    (snap / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="sliding_window: missing: the model has sliding-window layers"):
        find_model(str(snap))
    config["layer_types"] = ["chunked_attention"] * 32
    (snap / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"layer_types\[0\]: 'chunked_attention' not understood"):
        find_model(str(snap))
    del config["layer_types"]
    config["quantization_config"] = {"quant_method": "awq"}
    (snap / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="quant_method 'awq' not understood"):
        find_model(str(snap))
    del config["quantization_config"]
    del config["num_hidden_layers"]
    (snap / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="num_hidden_layers: missing"):
        find_model(str(snap))
    (snap / "config.json").write_text("{")
    with pytest.raises(InputError, match="cannot read"):
        find_model(str(snap))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"without config\.json"):
        find_model(str(empty))


@pytest.mark.parametrize("hardware", sorted(HARDWARE))
def test_every_shipped_model_deploys_on_every_hardware(hardware: str) -> None:
    for name in shipped_models():
        dep = deploy(name, hardware, 8)
        assert dep.kv_bytes_per_token_gpu > 0 and dep.cost.a > 0
        assert dep.gpu_blocks(16, 0.9) > 0 or dep.weight_bytes_gpu > 0.9 * HARDWARE[hardware].hbm_bytes - 8e9


def _startup(argv: list[str]) -> list[str]:
    import argparse

    from agentsweep.engine_sim import cli as sim_cli

    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    args = parser.parse_args(argv)
    return sim_cli.startup_lines(args, sim_cli.resolve(args))


def test_startup_states_kv_bytes_pool_and_calibration(tmp_path: Path) -> None:
    snap = _local_copy(tmp_path, "moonshotai/Kimi-K2-Instruct")
    lines = _startup([str(snap), "--tp", "8", "--hardware", "gb300", "--kv-cache-dtype", "fp8"])
    text = "\n".join(lines)
    assert f"model config: config.json in {snap}" in text
    assert "KV bytes per token: 281,088 over all ranks, 35,136 per GPU" in text  # latent on every rank
    assert "profile=kimi-k2 hardware=gb300" in text
    assert (
        "calibration gb300/fp8: no published point; extrapolated with the fractions fitted on b200/fp8"
        in text
    )
    assert "and from deepseek-r1 to kimi-k2" in text
    pool = next(ln for ln in lines if "KV pool:" in ln)
    assert int(pool.split("KV pool: ")[1].split(" tokens")[0].replace(",", "")) > 100_000
    lines = _startup(["openai/gpt-oss-120b", "--hardware", "mi325x"])
    assert any("18 of 36 layers keep a KV cache" in ln for ln in lines)
    assert any("calibration mi325x/fp4: no published point" in ln for ln in lines)
    lines = _startup(["some-org/Mystery-13B"])
    assert any("no config.json found" in ln for ln in lines)


def test_qwen3_next_counts_match_the_published_totals() -> None:
    """Qwen3-Coder-Next (Qwen3-Next's shape): 79,674,391,296 parameters, 3,874,929,408 active with the
    input embedding (the published safetensors totals). Its full-attention layers gate their output
    (q_proj gives a query and a gate per head) though no config field says so."""
    shape = find_model("Qwen/Qwen3-Coder-Next")
    embedding = 151936 * 2048
    assert shape.total_params == pytest.approx(79_674_391_296, rel=1e-4)
    assert shape.active_params + embedding == pytest.approx(3_874_929_408, rel=1e-3)
    assert (shape.layers, shape.linear_layers, shape.experts, shape.experts_per_token) == (12, 36, 512, 10)
    # Gated DeltaNet state per sequence: 32 value heads x 128 x 128 in FP32, and the convolution's last 3
    # inputs of q, k, v (2 x 16 x 128 + 32 x 128) in BF16, in each of the 36 layers.
    assert shape.linear_state_bytes == 36 * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2)


def test_attention_kinds_reach_kv_bytes_per_token() -> None:
    kinds = {name: find_model(name).attention_kinds for name in shipped_models()}
    assert kinds["deepseek-ai/DeepSeek-V3.2"] == ("mla", "sparse")
    assert kinds["deepseek-ai/DeepSeek-V3-0324"] == kinds["moonshotai/Kimi-K2-Instruct"] == ("mla",)
    assert kinds["openai/gpt-oss-120b"] == ("gqa", "sliding")
    assert kinds["Qwen/Qwen3-Coder-Next"] == kinds["Qwen/Qwen3.5-397B-A17B"] == ("gqa", "linear")
    assert kinds["MiniMaxAI/MiniMax-M2"] == kinds["meta-llama/Llama-3.3-70B-Instruct"] == ("gqa",)
    # DSA: the indexer's keys (128 FP8 values and one FP32 scale per token per layer) sit beside the
    # latent, and stay FP8 whatever the KV cache's dtype.
    v32 = deploy("deepseek-ai/DeepSeek-V3.2", "b200", 8)
    assert v32.kv_bytes_per_token_gpu == 61 * 576 * 2 + 61 * 132
    assert deploy("deepseek-ai/DeepSeek-V3.2", "b200", 8, kv_cache_dtype="fp8").kv_bytes_per_token_gpu == (
        61 * 576 + 61 * 132
    )
    # The sliding window and the linear layers hold a bounded state: no bytes per token.
    oss = find_model("openai/gpt-oss-120b")
    assert (oss.sliding_layers, oss.sliding_window, oss.layers) == (18, 128, 18)


def test_startup_says_each_attention_kind_and_what_is_not_modelled() -> None:
    text = "\n".join(_startup(["deepseek-ai/DeepSeek-V3.2", "--tp", "8", "--hardware", "b300"]))
    assert "78,324 per GPU (61 of 61 layers keep a KV cache, MLA latent 576 per layer + 132 bytes" in text
    assert "attention: 61 MLA layers" in text and "picks the top 2,048 tokens for every query" in text
    assert "not modelled: sparse attention reads only 2,048 tokens per query" in text
    text = "\n".join(_startup(["Qwen/Qwen3-Coder-Next", "--tp", "2", "--hardware", "gb300"]))
    assert "36 linear-attention layers keep a fixed state, 38.6 MB per sequence per GPU" in text
    assert "not modelled: the linear-attention state is not taken from the KV pool" in text
    text = "\n".join(_startup(["openai/gpt-oss-120b", "--hardware", "h200"]))
    assert (
        "18 sliding-window layers keep at most 128 tokens per sequence (4.7 MB per running sequence" in text
    )
    assert "not modelled: the sliding-window layers' KV is not taken from the KV pool" in text
    lines = _startup(["MiniMaxAI/MiniMax-M2", "--tp", "4", "--hardware", "mi355x"])
    assert "[engine_sim] attention: 62 full-attention layers (8 KV heads x head dim 128)" in lines
    assert not any("not modelled" in line for line in lines)


def test_a_model_in_the_hugging_face_cache_is_read_from_there_before_the_shipped_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    name = "zai-org/GLM-4.6"
    assert "shipped" in find_model(name).source  # no folder for it in the cache: the shipped config
    snap = _local_copy(tmp_path, name)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text(snap.name)
    shape = find_model(name)
    assert "Hugging Face cache" in shape.source and shape.key == "glm-4.6"
