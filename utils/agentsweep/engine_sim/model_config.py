"""A model's shape from its Hugging Face ``config.json``: what the step and memory models need.

Where the config comes from, first found wins (no network in any case):

1. ``MODEL`` is a local directory holding ``config.json`` (a Hugging Face cache snapshot or a copy);
2. the Hugging Face cache (``huggingface_hub.try_to_load_from_cache``: ``HF_HUB_CACHE`` / ``HF_HOME``);
3. the configs shipped beside this module (``models/<org>/<name>/config.json``, see its README);
4. none: a dense profile guessed from the ``<N>B`` in the name, and the start-up line says so.

Derived: the layers that keep a KV cache for every token (full attention; sliding-window and
linear-attention layers hold a bounded per-sequence state the pool does not count, and the shape says
how much), KV heads and head dimension or the MLA latent (``kv_lora_rank + qk_rope_head_dim``), a
sparse-attention indexer's keys (DeepSeek's DSA: ``index_head_dim`` per token per layer, FP8 with a
scale, beside the latent), attention FLOPs per prefill
(query, context) pair, the MoE layout (routed and shared experts, experts per token, which layers),
parameter counts computed from the shapes (total, routed experts, active per token; multi-token
prediction layers and vision towers left out, as model cards count them), the checkpoint's native
precision (its ``quantization_config``), and the checkpoint size from ``model.safetensors.index.json``
where a directory has one. Fields the derivation does not use are named in one line (not an error);
a value it cannot interpret is an :class:`~agentsweep.errors.InputError` naming the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentsweep.errors import InputError

SHIPPED_DIR = Path(__file__).with_name("models")
INDEX_FILE = "model.safetensors.index.json"

# Fields that carry no shape the simulator models (tokens ids, initialisation, rope details, router
# scoring, vision towers): read as understood and left out of the "not used" line.
_IGNORED = frozenset(
    [
        "architectures",
        "auto_map",
        "model_type",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "hidden_act",
        "initializer_range",
        "rms_norm_eps",
        "layer_norm_eps",
        "norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "partial_rotary_factor",
        "attention_dropout",
        "hidden_dropout",
        "use_cache",
        "transformers_version",
        "pretraining_tp",
        "mlp_bias",
        "attention_bias",
        "routed_scaling_factor",
        "scoring_func",
        "topk_method",
        "n_group",
        "topk_group",
        "norm_topk_prob",
        "aux_loss_alpha",
        "seq_aux",
        "ep_size",
        "output_router_logits",
        "router_aux_loss_coef",
        "use_qk_norm",
        "vision_config",
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
        "swiglu_limit",
        "rope_interleave",
        "initial_context_length",
        "max_window_layers",
        "use_sliding_window",
        "full_attention_interval",
        "quantization_config",
        "torch_dtype",
        "dtype",
        "tie_word_embeddings",
        "text_config",
        "num_nextn_predict_layers",
        "mtp_num_hidden_layers",
        "qk_layernorm",
        "rotary_dim",
        "use_routing_bias",
        "use_mtp",
        "num_mtp_modules",
        "mtp_transformer_layers",
    ]
)
_READ = frozenset(
    [
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "intermediate_size",
        "max_position_embeddings",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "layer_types",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "attn_output_gate",
        "sliding_window",
        "linear_conv_kernel_dim",
        "index_head_dim",
        "index_n_heads",
        "index_topk",
        "n_routed_experts",
        "num_experts",
        "num_local_experts",
        "num_experts_per_tok",
        "experts_per_token",
        "moe_intermediate_size",
        "n_shared_experts",
        "shared_expert_intermediate_size",
        "first_k_dense_replace",
        "moe_layer_freq",
        "decoder_sparse_step",
        "mlp_only_layers",
    ]
)
_LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
# Model types whose full-attention layers gate their output (q_proj gives a query and a gate per head)
# without an attn_output_gate field to say so.
_GATED_ATTENTION = frozenset({"qwen3_next"})
# A linear-attention layer's per-sequence state (Gated DeltaNet): the recurrent state in FP32, the
# short convolution's last kernel - 1 inputs in BF16.
STATE_BYTES, CONV_BYTES = 4, 2
# A sparse-attention indexer key per token per layer: FP8, with one FP32 scale per 128 values (vLLM's
# and SGLang's DeepSeek-V3.2 indexer cache).
INDEXER_BLOCK, INDEXER_SCALE_BYTES = 128, 4


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Everything the simulator derives from one config (see the module docstring)."""

    key: str  # profile key: the repository name, lower case, quantization/date/instruct suffixes dropped
    source: str  # where the config came from (one line)
    total_params: float
    active_params: float  # per token, compute: routed experts at k of E, the input embedding left out
    routed_expert_params: float  # all routed experts of all MoE layers (0 = dense)
    layers: int  # layers that keep a KV cache for every token
    kv_heads: int  # 0 for MLA
    head_dim: int
    mla_dim: int  # latent + rope dims per layer for MLA (one entry per token, not per head)
    max_model_len: int
    native_precision: str  # bf16 | fp8 | fp4
    dense_precision: str  # what the weights outside the routed experts are stored in
    all_layers: int
    experts: int
    experts_per_token: int
    moe_layers: int
    attn_flops_per_pair: float
    checkpoint_bytes: float = 0.0  # from the safetensors index (0 = unknown)
    unused_fields: tuple[str, ...] = ()
    # Layers that keep a bounded state instead of a cache for every token (not in ``layers``).
    sliding_layers: int = 0
    sliding_window: int = 0  # tokens a sliding-window layer keeps per sequence
    linear_layers: int = 0
    linear_state_bytes: int = 0  # per sequence, all linear-attention layers (recurrent + conv state)
    # Sparse attention (DeepSeek's DSA): an indexer picks ``index_topk`` tokens for each query from keys
    # of ``indexer_bytes`` per token per full layer, kept beside the latent.
    indexer_bytes: int = 0
    index_topk: int = 0

    @property
    def attention_kinds(self) -> tuple[str, ...]:
        """The kinds of attention the model has: mla or gqa, and sparse, sliding, linear."""
        kinds = ["mla" if self.mla_dim else "gqa"]
        if self.index_topk:
            kinds.append("sparse")
        if self.sliding_layers:
            kinds.append("sliding")
        if self.linear_layers:
            kinds.append("linear")
        return tuple(kinds)


def profile_key(name: str) -> str:
    """``deepseek-ai/DeepSeek-R1-0528`` -> ``deepseek-r1``: the name a calibration refers to."""
    parts = name.rstrip("/").split("/")
    cache = [p for p in parts if p.startswith("models--")]  # a Hugging Face cache folder names the repo
    key = (cache[-1].split("--")[-1] if cache else parts[-1]).lower()
    suffix = re.compile(r"-(instruct|fp8|fp4(-v\d+)?|nvfp4|mxfp4|preview|\d{4})$")
    while (stripped := suffix.sub("", key)) != key and stripped:
        key = stripped
    return key


def find_config(name: str) -> tuple[dict[str, Any], str, Path | None] | None:
    """(config, where it came from, its directory) for ``name``, or None when no config is found."""
    local = Path(name).expanduser()
    if local.is_dir():
        snapshot = _snapshot_dir(local)
        if snapshot is None:
            raise InputError(f"model {name}: a directory without config.json")
        return _read(snapshot / "config.json"), f"config.json in {snapshot}", snapshot
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        cached = _from_hf_cache(name)
        if cached is not None:
            return _read(cached), f"{name} config.json from the Hugging Face cache", cached.parent
        shipped = _shipped(name)
        if shipped is not None:
            return _read(shipped), f"{name} config.json shipped with agentsweep", None
    kin = _shipped_kin(name)
    if kin is not None:
        repo, path = kin
        return _read(path), f"no config.json for {name}; the shipped one of {repo} (same model by name)", None
    return None


def _from_hf_cache(name: str) -> Path | None:
    """``name``'s config.json in the Hugging Face cache (``try_to_load_from_cache``); None when it has
    none or the hf extra is not installed. The file lookup is imported only when the cache has a folder
    for ``name``: it costs a sixth of a second of CPU, paid by every engine start of a model that was
    never downloaded."""
    try:
        from huggingface_hub import constants
    except ImportError:  # the hf extra is not installed: only local and shipped configs
        return None
    if not (Path(constants.HF_HUB_CACHE) / ("models--" + name.replace("/", "--"))).is_dir():
        return None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    return Path(cached) if isinstance(cached, str) else None  # else absent, or cached as absent


def _snapshot_dir(folder: Path) -> Path | None:
    if (folder / "config.json").is_file():
        return folder
    snaps = sorted(folder.glob("snapshots/*/config.json"), key=lambda p: p.stat().st_mtime)
    return snaps[-1].parent if snaps else None


def _shipped(name: str) -> Path | None:
    want = name.lower()
    for path in SHIPPED_DIR.glob("*/*/config.json"):
        if f"{path.parent.parent.name}/{path.parent.name}".lower() == want:
            return path
    return None


def _shipped_kin(name: str) -> tuple[str, Path] | None:
    """The shipped config of the same model by profile key (a re-quantized or renamed copy), the
    shortest name first (the original, not a quantized variant)."""
    key = profile_key(name)
    kin = [repo for repo in shipped_models() if profile_key(repo) == key]
    if not kin:
        return None
    repo = min(kin, key=lambda r: (len(r), r))
    path = _shipped(repo)
    return (repo, path) if path is not None else None


def shipped_models() -> list[str]:
    """Repository names of the shipped configs."""
    return sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in SHIPPED_DIR.glob("*/*/config.json"))


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(
            f"model config {path}: cannot read: {getattr(err, 'strerror', None) or err}"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"model config {path}: expected a JSON object")
    return data


def load_shape(name: str) -> ModelShape | None:
    """The shape of ``name`` from its config, or None when none is found (module docstring)."""
    found = find_config(name)
    if found is None:
        return None
    config, source, folder = found
    shape = derive(config, profile_key(name), source)
    if folder is not None and (folder / INDEX_FILE).is_file():
        index = _read(folder / INDEX_FILE)
        size = (
            index.get("metadata", {}).get("total_size") if isinstance(index.get("metadata"), dict) else None
        )
        if isinstance(size, (int, float)) and size > 0:
            from dataclasses import replace

            shape = replace(shape, checkpoint_bytes=float(size))
    return shape


class _Fields:
    """Typed reads of one config section; every error names the source and the field."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def bad(self, field: str, what: str) -> InputError:
        return InputError(f"model config ({self.source}): {field}: {what}")

    def integer(self, field: str, default: int | None = None) -> int:
        raw = self.data.get(field)
        if raw is None:
            if default is None:
                raise self.bad(field, "missing")
            return default
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise self.bad(field, f"expected a non-negative integer, got {raw!r}")
        return int(raw)

    def has(self, field: str) -> bool:
        return self.data.get(field) is not None


def native_precision(config: dict[str, Any], source: str) -> str:
    """bf16 | fp8 | fp4 from ``quantization_config`` (bf16 when there is none)."""
    q = config.get("quantization_config")
    if not q:
        return "bf16"
    if not isinstance(q, dict):
        raise InputError(f"model config ({source}): quantization_config: expected an object")
    method = str(q.get("quant_method", "")).lower()
    text = json.dumps(q).lower()
    if method == "fp8":
        return "fp8"
    if method == "mxfp4":
        return "fp4"
    if method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        if "FP4" in algo:
            return "fp4"
        if "FP8" in algo:
            return "fp8"
        raise InputError(f"model config ({source}): quantization_config.quant_algo {algo!r} not understood")
    if method == "quark":
        if '"dtype": "fp4"' in text:
            return "fp4"
        if '"dtype": "fp8' in text:
            return "fp8"
        raise InputError(f"model config ({source}): quantization_config (quark): weight dtype not understood")
    if method == "compressed-tensors":
        if '"num_bits": 8' in text and '"type": "float"' in text:
            return "fp8"
        if '"num_bits": 4' in text and '"type": "float"' in text:
            return "fp4"
        raise InputError(
            f"model config ({source}): quantization_config (compressed-tensors): only FP8 and FP4 weights are modelled"
        )
    raise InputError(f"model config ({source}): quantization_config.quant_method {method!r} not understood")


def derive(config: dict[str, Any], key: str, source: str) -> ModelShape:
    """The shape of one config (module docstring). ``text_config`` is read where a config nests one."""
    text = config.get("text_config")
    section = text if isinstance(text, dict) else config
    f = _Fields(section, source)
    unused = sorted((set(config) | set(section)) - _READ - _IGNORED)

    n_layers = f.integer("num_hidden_layers")
    hidden = f.integer("hidden_size")
    heads = f.integer("num_attention_heads")
    kv_heads = f.integer("num_key_value_heads", heads)
    head_dim = f.integer("head_dim", hidden // max(heads, 1))
    vocab = f.integer("vocab_size")
    tied = bool(section.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))

    # -- layer kinds: which layers keep a KV cache for every token
    raw_types = section.get("layer_types")
    if raw_types is None:
        if f.has("full_attention_interval") and f.has("linear_num_value_heads"):
            every = f.integer("full_attention_interval")
            raw_types = [
                "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n_layers)
            ]
        else:
            raw_types = ["full_attention"] * n_layers
    if not isinstance(raw_types, list) or len(raw_types) != n_layers:
        raise f.bad("layer_types", f"expected a list of {n_layers} layer types")
    for i, kind in enumerate(raw_types):
        if kind not in _LAYER_TYPES:
            raise f.bad(
                f"layer_types[{i}]", f"{kind!r} not understood (expected one of {', '.join(_LAYER_TYPES)})"
            )
    full = sum(1 for k in raw_types if k == "full_attention")
    sliding = sum(1 for k in raw_types if k == "sliding_attention")
    softmax_layers = sum(1 for k in raw_types if k != "linear_attention")
    window = f.integer("sliding_window", 0) if sliding else 0
    if sliding and not window:
        raise f.bad("sliding_window", "missing: the model has sliding-window layers")

    # -- attention parameters and KV
    mla = f.has("kv_lora_rank")
    if mla:
        lora, rope = f.integer("kv_lora_rank"), f.integer("qk_rope_head_dim")
        nope, v_dim = f.integer("qk_nope_head_dim"), f.integer("v_head_dim")
        q_lora = f.integer("q_lora_rank", 0)
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        attn = q + hidden * (lora + rope) + lora * heads * (nope + v_dim) + heads * v_dim * hidden
        mla_dim, qk_dim, kv_heads_out, head_dim_out = lora + rope, nope + rope, 0, 0
    else:
        gated = section.get(
            "attn_output_gate", section.get("model_type", config.get("model_type")) in _GATED_ATTENTION
        )
        gate = 2 if gated else 1
        attn = hidden * heads * head_dim * (gate + 1) + 2 * hidden * kv_heads * head_dim
        mla_dim, qk_dim, v_dim, kv_heads_out, head_dim_out = 0, head_dim, head_dim, kv_heads, head_dim
    linear = linear_state = 0
    if softmax_layers < n_layers:
        nk, nv = f.integer("linear_num_key_heads"), f.integer("linear_num_value_heads")
        dk, dv = f.integer("linear_key_head_dim"), f.integer("linear_value_head_dim")
        # q, k, v and the output gate in; a and b per value head; the output projection
        linear = hidden * (2 * nk * dk + 2 * nv * dv) + 2 * hidden * nv + nv * dv * hidden
        kernel = f.integer("linear_conv_kernel_dim", 4)
        linear_state = nv * dk * dv * STATE_BYTES + (2 * nk * dk + nv * dv) * max(kernel - 1, 0) * CONV_BYTES
    indexer = topk = 0
    if f.has("index_topk"):
        if not mla:
            raise f.bad("index_topk", "a sparse-attention indexer is modelled only beside MLA")
        index_dim, topk = f.integer("index_head_dim"), f.integer("index_topk")
        f.integer("index_n_heads")  # its query heads: compute the step model leaves out (start-up line)
        indexer = index_dim + -(-index_dim // INDEXER_BLOCK) * INDEXER_SCALE_BYTES

    # -- MLP: dense and MoE layers
    experts = next(
        (f.integer(k) for k in ("n_routed_experts", "num_experts", "num_local_experts") if f.has(k)), 0
    )
    per_token = next((f.integer(k) for k in ("num_experts_per_tok", "experts_per_token") if f.has(k)), 0)
    if experts and not per_token:
        raise f.bad("num_experts_per_tok", "missing for a MoE model")
    if experts:
        expert_size = f.integer("moe_intermediate_size", 0) or f.integer("intermediate_size")
        one_expert = 3 * hidden * expert_size
        shared = f.integer("n_shared_experts", 0) * one_expert + 3 * hidden * f.integer(
            "shared_expert_intermediate_size", 0
        )
        first_dense = f.integer("first_k_dense_replace", 0)
        freq = f.integer("moe_layer_freq", 1) or 1
        step = f.integer("decoder_sparse_step", 1) or 1
        dense_only = section.get("mlp_only_layers") or []
        if not isinstance(dense_only, list):
            raise f.bad("mlp_only_layers", "expected a list of layer indices")
        moe_flags = [
            i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
            for i in range(n_layers)
        ]
    else:
        one_expert = shared = 0
        moe_flags = [False] * n_layers
    moe_layers = sum(moe_flags)
    dense_mlp = 3 * hidden * f.integer("intermediate_size") if moe_layers < n_layers else 0

    routed = moe_layers * experts * one_expert
    router = moe_layers * experts * hidden
    embed = vocab * hidden
    total = (
        embed * (1 if tied else 2)
        + softmax_layers * attn
        + (n_layers - softmax_layers) * linear
        + (n_layers - moe_layers) * dense_mlp
        + moe_layers * shared
        + router
        + routed
    )
    active = total - embed - (routed * (1 - per_token / experts) if experts else 0)

    precision = native_precision(config, source)
    method = str((config.get("quantization_config") or {}).get("quant_method", "")).lower()
    # FP4 checkpoints of MoE models: NVIDIA's (modelopt NVFP4) quantize the routed experts and keep
    # attention at FP8; gpt-oss's MXFP4 keeps attention and embeddings at BF16; AMD's Quark MXFP4
    # quantizes every linear layer but lm_head.
    dense_precision = precision
    if precision == "fp4" and experts:
        dense_precision = {"mxfp4": "bf16", "quark": "fp4"}.get(method, "fp8")
    max_len = f.integer("max_position_embeddings", 0) or 131072
    return ModelShape(
        key=key,
        source=source,
        total_params=float(total),
        active_params=float(active),
        routed_expert_params=float(routed),
        layers=full,
        kv_heads=kv_heads_out,
        head_dim=head_dim_out,
        mla_dim=mla_dim,
        max_model_len=max_len,
        native_precision=precision,
        dense_precision=dense_precision,
        all_layers=n_layers,
        experts=experts,
        experts_per_token=per_token,
        moe_layers=moe_layers,
        attn_flops_per_pair=2.0 * full * heads * (qk_dim + v_dim),
        unused_fields=tuple(unused),
        sliding_layers=sliding,
        sliding_window=window,
        linear_layers=n_layers - softmax_layers,
        linear_state_bytes=(n_layers - softmax_layers) * linear_state,
        indexer_bytes=indexer,
        index_topk=topk,
    )
