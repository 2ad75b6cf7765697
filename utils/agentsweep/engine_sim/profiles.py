"""Hardware x model profiles: KV bytes per token, GPU pool size and the step-time model.

Step time (seconds of simulated time) of one engine iteration that computes ``P`` prefill tokens,
``B`` decode tokens (one per decoding sequence), reads ``K`` KV tokens and ``Q`` prefill attention
pairs (query token x context token)::

    t = a + [P > 0] * a_p + b * P + c * B + d * K + e * Q + m * (1 - (1 - k / E) ** (P + B))

* ``a``: fixed per-step cost: the calibrated step overhead (launches, scheduling, sampling: it does
  not scale with bandwidth), two all-reduces per layer when TP > 1, one read of the weights every
  token uses (all of a dense model; attention, shared experts and embeddings of a MoE), and with
  expert parallelism a dispatch + combine per MoE layer.
* ``a_p``: the extra fixed cost of a step that prefills (no CUDA graph, larger kernels).
* ``b``: compute per prefill token, 2 x active parameters FLOPs over TP x dense peak x MFU.
* ``c``: per decoding sequence, the same compute plus per-sequence bookkeeping.
* ``d``: KV bytes per token per GPU over the achieved HBM bandwidth (attention reads).
* ``e``: attention FLOPs per (query, context) pair of a prefill (quadratic in the prompt) over the
  BF16 peak x MFU.
* ``m``: time to read every routed expert once (MoE only). A step of ``n`` tokens touches on
  average ``E * (1 - (1 - k/E)**n)`` of the ``E`` experts of a layer (each token picks ``k``), so small
  decode batches read a fraction of the experts and prefills read them all: the main reason a MoE
  decode step grows with the batch.

The achieved fractions (HBM bandwidth, MFU) and the two overheads are fitted per hardware x
precision to published serving measurements (``calibration.json`` beside this file, written by
``agentsweep calibrate --fit``; ``docs/engine-sim.md`` shows the fit and its error). A hardware x
precision without published points uses the defaults and says so at startup.

Published figures used (vendor datasheets; model ``config.json`` files on Hugging Face):

* NVIDIA H200 SXM: 141 GB HBM3e, 4.8 TB/s, 1,979 TFLOPS dense FP8 (989 dense BF16).
* NVIDIA B200 (HGX B200): 180 GB HBM3e, 8 TB/s, 4.5 PFLOPS dense FP8, 9 PFLOPS dense FP4.
* AMD Instinct MI355X: 288 GB HBM3E, 8 TB/s, ~5 PFLOPS dense FP8 (~2.5 FP16), ~10 PFLOPS MXFP4.
* Host link PCIe Gen5 x16: 64 GB/s per direction raw; ~50 GB/s is what pinned copies reach.
* meta-llama/Llama-3.3-70B-Instruct: 70.6 B params, 80 layers, 8 KV heads x head dim 128 (GQA).
* deepseek-ai/DeepSeek-R1: 671 B params (37 B active), 61 layers (58 MoE) with 256 routed experts of
  which each token uses 8, MLA latent KV of 512 + 64 rope dims per layer (one latent per token,
  replicated on every TP rank), 128 attention heads with 192 query-key and 128 value dims, FP8 weights.
  FP4 checkpoints quantize the routed experts; the rest stays FP8.
* Qwen/Qwen3.5-397B-A17B: 397 B params (17 B active), 60 layers of which every 4th uses full
  attention (15 layers, 2 KV heads x head dim 256); the linear-attention layers keep a fixed
  per-sequence state that this model ignores. Its expert layout (512 routed experts, 10 per token)
  is assumed to follow Qwen3-Next's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

GB = 1e9
GIB = float(1 << 30)
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")


@dataclass(frozen=True, slots=True)
class Hardware:
    name: str
    hbm_bytes: float  # per GPU
    hbm_bw: float  # bytes/s per GPU
    flops: dict[str, float]  # dense peak per GPU by compute precision (bf16, fp8, fp4)
    host_link_bw: float  # bytes/s per GPU, host <-> device (pinned copies)
    # Board power (W): the vendor's maximum for the whole board, what a GPU drawing all it may reaches.
    board_power_w: float = 700.0
    # Idle power (W) of a GPU an engine holds (a context open, its memory allocated, no kernel running).
    idle_power_w: float = 125.0


# Board power, from the vendors' public specifications:
# - NVIDIA H200 SXM: "Max Thermal Design Power (TDP): up to 700W (configurable)" (NVIDIA H200 Tensor
#   Core GPU datasheet / product page, SXM form factor).
# - NVIDIA B200 in HGX B200: up to 1,000 W per GPU (NVIDIA HGX B200 / Blackwell datasheet, "Max Thermal
#   Design Power (TDP)" of the HGX B200 GPU).
# - AMD Instinct MI355X: 1,400 W "Total Board Power (TBP)" (AMD Instinct MI355X product page and
#   data sheet; the air-cooled MI350X is 1,000 W).
# Idle power is not in any datasheet. Recorded with nvidia-smi (tests/energy/fixtures): an H100 (700 W
# board) idles at 71 W bare and at 120-127 W once a process holds a CUDA context and memory, as a
# serving engine does; an H200 idles at 80 W bare and draws about 691 W of its 700 W limit under a bf16
# matmul loop. The H200 takes the held-context 125 W, and the B200 and MI355X the same 18 % of their
# board power (an estimate until they are measured).
HARDWARE: dict[str, Hardware] = {
    # NVIDIA H200 SXM datasheet (no FP4 units: FP4 weights compute at FP8 rate).
    "h200": Hardware(
        "h200", 141 * GB, 4.8e12, {"bf16": 989e12, "fp8": 1979e12, "fp4": 1979e12}, 50 * GB,
        board_power_w=700.0, idle_power_w=125.0,
    ),
    # NVIDIA HGX B200 (per GPU).
    "b200": Hardware(
        "b200", 180 * GB, 8.0e12, {"bf16": 2.25e15, "fp8": 4.5e15, "fp4": 9.0e15}, 50 * GB,
        board_power_w=1000.0, idle_power_w=180.0,
    ),
    # AMD Instinct MI355X datasheet.
    "mi355x": Hardware(
        "mi355x", 288 * GB, 8.0e12, {"bf16": 2.5e15, "fp8": 5.0e15, "fp4": 10.0e15}, 50 * GB,
        board_power_w=1400.0, idle_power_w=250.0,
    ),
}  # fmt: skip

ALLREDUCE_S = 12e-6  # one small all-reduce over NVLink / Infinity Fabric (two per layer when TP > 1)
ACTIVATION_RESERVE_BYTES = 4 * GB  # per GPU: activations, CUDA graphs, workspace


@dataclass(frozen=True, slots=True)
class Efficiency:
    """The calibrated coefficients of one hardware x precision (see the module docstring)."""

    step_overhead_s: float  # fixed time per step that does not scale with bandwidth
    hbm_eff: float  # achieved fraction of the HBM bandwidth (weights, KV)
    mfu: float  # achieved fraction of the dense peak FLOPS (prefill and decode compute)
    prefill_overhead_s: float  # extra fixed time of a step that prefills

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Efficiency:
        return cls(
            float(d["step_overhead_s"]), float(d["hbm_eff"]), float(d["mfu"]), float(d["prefill_overhead_s"])
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "step_overhead_s": self.step_overhead_s,
            "hbm_eff": self.hbm_eff,
            "mfu": self.mfu,
            "prefill_overhead_s": self.prefill_overhead_s,
        }


@dataclass(frozen=True, slots=True)
class Shared:
    """Coefficients fitted over all hardware together (too few points to tell hardware apart)."""

    per_seq_s: float  # bookkeeping per decoding sequence per step
    ep_layer_s: float  # expert-parallel dispatch + combine, per MoE layer per step


# Used where no calibration applies (and as the fitter's starting point).
DEFAULT_EFFICIENCY = Efficiency(step_overhead_s=5e-3, hbm_eff=0.6, mfu=0.3, prefill_overhead_s=20e-3)
DEFAULT_SHARED = Shared(per_seq_s=15e-6, ep_layer_s=20e-6)


@dataclass(frozen=True, slots=True)
class Calibration:
    """Which coefficients a deployment uses and where they come from (logged at startup)."""

    key: str  # "hardware/precision"
    efficiency: Efficiency
    shared: Shared
    points: int  # published points the coefficients were fitted to (0 = defaults)
    source: str  # one line: the data set, or why there is none
    model: str = ""  # the model profile the points measured

    def describe(self, model_key: str) -> str:
        if not self.points:
            return f"calibration {self.key}: no published data, default coefficients ({self.source})"
        text = (
            f"calibration {self.key}: fitted to {self.points} published {self.model} points ({self.source})"
        )
        if model_key != self.model:
            text += f"; none for {model_key}, whose figures extrapolate from them"
        return text


@cache
def load_calibrations(path: str = str(CALIBRATION_FILE)) -> dict[str, Calibration]:
    """hardware/precision -> Calibration from the data file (empty when there is none)."""
    file = Path(path)
    if not file.is_file():
        return {}
    data = json.loads(file.read_text())
    shared = Shared(float(data["shared"]["per_seq_s"]), float(data["shared"]["ep_layer_s"]))
    out: dict[str, Calibration] = {}
    for key, group in data["groups"].items():
        out[key] = Calibration(
            key,
            Efficiency.from_dict(group["coefficients"]),
            shared,
            len(group.get("points", [])),
            str(data.get("source", "?")),
            str(group.get("model", "")),
        )
    return out


def calibration_for(hardware: str, precision: str) -> Calibration:
    key = f"{hardware}/{precision}"
    found = load_calibrations().get(key)
    if found is not None:
        return found
    cals = load_calibrations()
    shared = next(iter(cals.values())).shared if cals else DEFAULT_SHARED
    why = "not in calibration.json" if cals else "calibration.json missing"
    return Calibration(key, DEFAULT_EFFICIENCY, shared, 0, why)


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
    experts: int = 0  # routed experts per MoE layer (0 = dense)
    experts_per_token: int = 0
    moe_layers: int = 0
    attn_flops_per_pair: float = 0.0  # prefill attention FLOPs per (query, context) pair, all layers

    @property
    def is_moe(self) -> bool:
        return self.active_params < self.total_params

    @property
    def expert_params(self) -> float:
        """Routed expert parameters: total - active = experts x (1 - k/E) x params of one layer's experts."""
        if not self.experts:
            return 0.0
        return (self.total_params - self.active_params) / (1 - self.experts_per_token / self.experts)


def _attn_pair_flops(layers: int, heads: int, qk_dim: int, v_dim: int) -> float:
    return 2.0 * layers * heads * (qk_dim + v_dim)


MODELS: dict[str, Model] = {
    "llama-3.3-70b": Model(
        "llama-3.3-70b", 70.6e9, 70.6e9, 80, 8, 128, max_model_len=131072,
        attn_flops_per_pair=_attn_pair_flops(80, 64, 128, 128),
    ),
    "deepseek-r1": Model(
        "deepseek-r1", 671e9, 37e9, 61, 0, 0, mla_dim=576, max_model_len=163840, native_precision="fp8",
        experts=256, experts_per_token=8, moe_layers=58, attn_flops_per_pair=_attn_pair_flops(61, 128, 192, 128),
    ),
    "qwen3.5-397b-a17b": Model(
        "qwen3.5-397b-a17b", 397e9, 17e9, 15, 2, 256, max_model_len=262144, all_layers=60,
        experts=512, experts_per_token=10, moe_layers=60, attn_flops_per_pair=_attn_pair_flops(15, 32, 256, 256),
    ),
}  # fmt: skip

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
    heads = 32 if params < 15e9 else 64
    return Model(
        f"generic-{params / 1e9:g}b", params, params, layers, 8, 128,
        attn_flops_per_pair=_attn_pair_flops(layers, heads, 128, 128),
    )  # fmt: skip


def find_model(name: str) -> Model:
    low = name.lower()
    for pattern, key in _PATTERNS:
        if re.search(pattern, low):
            return MODELS[key]
    return generic_model(name)


@dataclass(frozen=True, slots=True)
class StepCost:
    """Step time model (module docstring). ``time`` is called once per engine step."""

    a: float
    b: float
    c: float
    d: float
    e: float = 0.0  # per prefill attention pair
    prefill_a: float = 0.0  # extra fixed time when the step prefills
    moe_s: float = 0.0  # time to read every routed expert once (0 = dense)
    miss: float = 1.0  # 1 - experts_per_token / experts: chance a token leaves a given expert unused

    def time(
        self, prefill_tokens: int, decode_batch: int, kv_tokens_read: int, attn_pairs: float = 0.0
    ) -> float:
        t = self.a + self.b * prefill_tokens + self.c * decode_batch + self.d * kv_tokens_read
        if prefill_tokens:
            t += self.prefill_a + self.e * attn_pairs
        if self.moe_s:
            t += self.moe_s * (1.0 - self.miss ** (prefill_tokens + decode_batch))
        return t

    def decode_run(self, k: int, step: float, batch: int, kv_tokens_read: int) -> float:
        """Time of ``k`` pure-decode steps in a row, the first taking ``step``: each step reads
        ``batch`` more KV tokens than the one before (every sequence grew by its token)."""
        return k * (step - self.d * kv_tokens_read) + self.d * (k * kv_tokens_read + batch * k * (k - 1) // 2)

    def experts_touched(self, tokens: int) -> float:
        """Fraction of the routed experts a step of ``tokens`` tokens reads."""
        return 1.0 - self.miss**tokens if self.moe_s else 0.0


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model on a hardware at a TP (and EP) size, with everything the engine needs."""

    model: Model
    hardware: Hardware
    tp: int
    precision: str
    kv_dtype_bytes: int
    kv_bytes_per_token_gpu: int  # bytes of KV per token held by each GPU
    weight_bytes_gpu: float
    cost: StepCost
    ep: int = 1
    calibration: Calibration | None = field(default=None, compare=False)

    @property
    def kv_bytes_per_token_all(self) -> int:
        """KV bytes per token summed over the TP ranks (what an offload copies)."""
        return self.kv_bytes_per_token_gpu * self.tp

    def gpu_blocks(self, block_size: int, mem_util: float) -> int:
        """Blocks that fit per GPU after weights and the activation reserve (<= 0: does not fit)."""
        free = self.hardware.hbm_bytes * mem_util - self.weight_bytes_gpu - ACTIVATION_RESERVE_BYTES
        return math.floor(free / (self.kv_bytes_per_token_gpu * block_size))


def weight_bytes(model: Model, precision: str) -> tuple[float, float]:
    """(bytes of the weights every token uses, bytes of the routed experts) for the whole model.

    FP4 checkpoints of MoE models quantize the routed experts; the other weights stay FP8.
    """
    per_param = _BYTES_PER_PARAM[precision]
    expert = model.expert_params
    dense_per_param = min(per_param, 1.0) if expert and precision == "fp4" else per_param
    return (model.total_params - expert) * dense_per_param, expert * per_param


def weight_read_s(dep: Deployment) -> float:
    """Seconds one step spends reading the weights every token uses, per GPU (the memory-bound part of
    the fixed step cost ``a``; the simulated GPU's power model counts it as memory load)."""
    cal = dep.calibration or calibration_for(dep.hardware.name, dep.precision)
    dense_bytes, _ = weight_bytes(dep.model, dep.precision)
    return dense_bytes / dep.tp / (dep.hardware.hbm_bw * cal.efficiency.hbm_eff)


def step_cost(
    model: Model, hw: Hardware, tp: int, ep: int, precision: str, kv_gpu: int, cal: Calibration
) -> StepCost:
    eff, shared = cal.efficiency, cal.shared
    dense_bytes, expert_bytes = weight_bytes(model, precision)
    bw = hw.hbm_bw * eff.hbm_eff
    flops = hw.flops[precision] * eff.mfu
    attn_flops = hw.flops["bf16"] * eff.mfu
    n_layers_all = model.all_layers or model.layers
    a = eff.step_overhead_s + dense_bytes / tp / bw
    if tp > 1:
        a += 2 * n_layers_all * ALLREDUCE_S
    if ep > 1 and model.experts:
        a += model.moe_layers * shared.ep_layer_s
    b = 2 * model.active_params / (tp * flops)
    miss = 1.0 - model.experts_per_token / model.experts if model.experts else 1.0
    return StepCost(
        a=a,
        b=b,
        c=b + shared.per_seq_s,
        d=kv_gpu / bw,
        e=model.attn_flops_per_pair / (tp * attn_flops),
        prefill_a=eff.prefill_overhead_s,
        moe_s=expert_bytes / tp / bw,
        miss=miss,
    )


def deploy(
    model_name: str,
    hardware: str,
    tp: int,
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
    ep: int = 1,
    calibration: Calibration | None = None,
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
    dense_bytes, expert_bytes = weight_bytes(model, precision)
    weight_gpu = (dense_bytes + expert_bytes) / tp  # EP splits the experts over the same GPUs
    cal = calibration or calibration_for(hardware, precision)
    cost = step_cost(model, hw, tp, ep, precision, kv_gpu, cal)
    return Deployment(model, hw, tp, precision, kv_dtype_bytes, kv_gpu, weight_gpu, cost, ep, cal)
