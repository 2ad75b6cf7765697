"""Hardware x model profiles: KV bytes per token, GPU pool size and the step-time model.

Step time (seconds of simulated time) for one engine iteration::

    t = a + b * prefill_tokens + c * decode_batch + d * kv_tokens_read

derived roofline-style from published hardware and model figures:

* ``a``: fixed per-step cost = launch/scheduling overhead + one read of the weights a step touches
  (HBM bandwidth at an achievable fraction) + two all-reduces per layer when TP > 1.
* ``b``: prefill compute per token = 2 x active parameters FLOPs over TP x dense peak x MFU.
* ``c``: per decoding sequence = the same per-token compute plus sampling/bookkeeping.
* ``d``: attention reads per context token = KV bytes per token per GPU over HBM bandwidth.

Published figures used (vendor datasheets; model ``config.json`` files on Hugging Face):

* NVIDIA H200 SXM: 141 GB HBM3e, 4.8 TB/s, 1,979 TFLOPS dense FP8 (989 dense BF16).
* NVIDIA B200 (HGX B200): 180 GB HBM3e, 8 TB/s, 4.5 PFLOPS dense FP8, 9 PFLOPS dense FP4.
* AMD Instinct MI355X: 288 GB HBM3E, 8 TB/s, ~5 PFLOPS dense FP8 (~2.5 FP16), ~10 PFLOPS MXFP4.
* Host link PCIe Gen5 x16: 64 GB/s per direction raw; ~50 GB/s is what pinned copies reach.
* meta-llama/Llama-3.3-70B-Instruct: 70.6 B params, 80 layers, 8 KV heads x head dim 128 (GQA).
* deepseek-ai/DeepSeek-R1: 671 B params (37 B active), 61 layers, MLA latent KV of 512 + 64 rope
  dims per layer (one latent per token, replicated on every TP rank), FP8 weights.
* Qwen/Qwen3.5-397B-A17B: 397 B params (17 B active), 60 layers of which every 4th uses full
  attention (15 layers, 2 KV heads x head dim 256); the linear-attention layers keep a fixed
  per-sequence state that this model ignores.

Calibration targets (order of magnitude, from public serving benchmarks such as the vLLM and
InferenceMAX dashboards): at low load a 70B dense FP8 model on 2-4 H200s streams at ~8-15 ms per
token and prefills ~10-20 k tokens/s per GPU group; large MoE models on 8 GPUs stream at ~10-25 ms
per token. B200 and MI355X land ~1.6-2x faster per step than H200. The coefficients below reproduce
those ranges (see ``docs/engine-sim.md`` for the resulting numbers); they are a model, not a
measurement.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

GB = 1e9
GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class Hardware:
    name: str
    hbm_bytes: float  # per GPU
    hbm_bw: float  # bytes/s per GPU
    flops: dict[str, float]  # dense peak per GPU by compute precision (bf16, fp8, fp4)
    host_link_bw: float  # bytes/s per GPU, host <-> device (pinned copies)


HARDWARE: dict[str, Hardware] = {
    # NVIDIA H200 SXM datasheet.
    "h200": Hardware("h200", 141 * GB, 4.8e12, {"bf16": 989e12, "fp8": 1979e12, "fp4": 1979e12}, 50 * GB),
    # NVIDIA HGX B200 (per GPU).
    "b200": Hardware("b200", 180 * GB, 8.0e12, {"bf16": 2.25e15, "fp8": 4.5e15, "fp4": 9.0e15}, 50 * GB),
    # AMD Instinct MI355X datasheet.
    "mi355x": Hardware("mi355x", 288 * GB, 8.0e12, {"bf16": 2.5e15, "fp8": 5.0e15, "fp4": 10.0e15}, 50 * GB),
}

# Achievable fractions of peak (typical of tuned serving kernels).
HBM_EFFICIENCY = 0.75
MOE_HBM_EFFICIENCY = 0.45  # grouped expert GEMMs at small batch reach less of the bandwidth
PREFILL_MFU = 0.45
MOE_PREFILL_MFU = 0.12  # expert routing, all-to-all and MLA attention keep MoE prefill far lower
STEP_OVERHEAD_S = 1.5e-3  # scheduler + sampling + launch per iteration (CUDA graphs on)
ALLREDUCE_S = 12e-6  # one small all-reduce over NVLink / Infinity Fabric
PER_SEQ_S = 15e-6  # per decoding sequence bookkeeping
ACTIVATION_RESERVE_BYTES = 4 * GB  # per GPU: activations, CUDA graphs, workspace


@dataclass(frozen=True, slots=True)
class Model:
    key: str
    total_params: float
    active_params: float
    layers: int  # layers that keep a KV cache
    kv_heads: int  # 0 for MLA
    head_dim: int
    mla_dim: int = 0  # latent + rope dims per layer for MLA (one entry per token, not per head)
    max_model_len: int = 131072
    native_precision: str = "bf16"
    all_layers: int = 0  # every transformer layer (for per-layer communication); 0 = ``layers``

    @property
    def is_moe(self) -> bool:
        return self.active_params < self.total_params


MODELS: dict[str, Model] = {
    "llama-3.3-70b": Model("llama-3.3-70b", 70.6e9, 70.6e9, 80, 8, 128, max_model_len=131072),
    "deepseek-r1": Model(
        "deepseek-r1", 671e9, 37e9, 61, 0, 0, mla_dim=576, max_model_len=163840, native_precision="fp8"
    ),
    "qwen3.5-397b-a17b": Model(
        "qwen3.5-397b-a17b", 397e9, 17e9, 15, 2, 256, max_model_len=262144, all_layers=60
    ),
}

# name pattern -> profile key (first match wins; matched against the lower-cased model name)
_PATTERNS: list[tuple[str, str]] = [
    (r"llama-3\.[13]-70b", "llama-3.3-70b"),
    (r"deepseek-(r1|v3)", "deepseek-r1"),
    (r"qwen3\.5-397b", "qwen3.5-397b-a17b"),
]

_BYTES_PER_PARAM = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}  # fp4 incl. block scales


def precision_of(name: str, native: str) -> str:
    low = name.lower()
    if re.search(r"(nv|mx)?fp4|w4a", low):
        return "fp4"
    if re.search(r"fp8|w8a8", low):
        return "fp8"
    return native


def generic_model(name: str) -> Model:
    """A dense GQA profile guessed from a ``<N>B`` in the name (8B when there is none)."""
    m = re.search(r"(\d+(?:\.\d+)?)b(?![a-z])", name.lower())
    params = float(m.group(1)) * 1e9 if m else 8e9
    layers = 32 if params < 15e9 else 64 if params < 40e9 else 80
    return Model(f"generic-{params / 1e9:g}b", params, params, layers, 8, 128)


def find_model(name: str) -> Model:
    low = name.lower()
    for pattern, key in _PATTERNS:
        if re.search(pattern, low):
            return MODELS[key]
    return generic_model(name)


@dataclass(frozen=True, slots=True)
class StepCost:
    a: float
    b: float
    c: float
    d: float

    def time(self, prefill_tokens: int, decode_batch: int, kv_tokens_read: int) -> float:
        return self.a + self.b * prefill_tokens + self.c * decode_batch + self.d * kv_tokens_read


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model on a hardware at a TP size, with everything the engine needs."""

    model: Model
    hardware: Hardware
    tp: int
    precision: str
    kv_dtype_bytes: int
    kv_bytes_per_token_gpu: int  # bytes of KV per token held by each GPU
    weight_bytes_gpu: float
    cost: StepCost

    @property
    def kv_bytes_per_token_all(self) -> int:
        """KV bytes per token summed over the TP ranks (what an offload copies)."""
        return self.kv_bytes_per_token_gpu * self.tp

    def gpu_blocks(self, block_size: int, mem_util: float) -> int:
        """Blocks that fit per GPU after weights and the activation reserve (<= 0: does not fit)."""
        free = self.hardware.hbm_bytes * mem_util - self.weight_bytes_gpu - ACTIVATION_RESERVE_BYTES
        return math.floor(free / (self.kv_bytes_per_token_gpu * block_size))


def deploy(
    model_name: str, hardware: str, tp: int, kv_cache_dtype: str = "auto", quantization: str | None = None
) -> Deployment:
    hw = HARDWARE[hardware]
    model = find_model(model_name)
    precision = (
        quantization if quantization in _BYTES_PER_PARAM else precision_of(model_name, model.native_precision)
    )
    kv_dtype_bytes = 1 if kv_cache_dtype.startswith("fp8") else 2
    if model.mla_dim:
        kv_gpu = model.layers * model.mla_dim * kv_dtype_bytes  # latent replicated on each rank
    else:
        heads_gpu = max(1, model.kv_heads // tp)
        kv_gpu = model.layers * 2 * heads_gpu * model.head_dim * kv_dtype_bytes
    weight_bytes = model.total_params * _BYTES_PER_PARAM[precision]
    weight_gpu = weight_bytes / tp
    # Bytes of weights one decode step streams per GPU: all of a dense model; for MoE the active
    # experts of a batch (~3x one token's active set), never more than the whole model.
    touched = (
        weight_bytes
        if not model.is_moe
        else min(weight_bytes, 3 * model.active_params * _BYTES_PER_PARAM[precision])
    )
    bw_eff = hw.hbm_bw * (MOE_HBM_EFFICIENCY if model.is_moe else HBM_EFFICIENCY)
    flops = hw.flops[precision] * (MOE_PREFILL_MFU if model.is_moe else PREFILL_MFU)
    n_layers_all = model.all_layers or model.layers
    a = STEP_OVERHEAD_S + touched / tp / bw_eff + (2 * n_layers_all * ALLREDUCE_S if tp > 1 else 0.0)
    b = 2 * model.active_params / (tp * flops)
    c = b + PER_SEQ_S
    d = kv_gpu / (hw.hbm_bw * HBM_EFFICIENCY)
    return Deployment(model, hw, tp, precision, kv_dtype_bytes, kv_gpu, weight_gpu, StepCost(a, b, c, d))
