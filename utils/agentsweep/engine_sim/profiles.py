"""Hardware x model profiles: KV bytes per token, GPU pool size and the step-time model.

Step time (seconds of simulated time) of one engine iteration that computes ``P`` prefill tokens,
``B`` decode tokens (one per decoding sequence), reads ``K`` KV tokens and ``Q`` prefill attention
pairs (query token x context token)::

    t = a + [P > 0] * a_p + b * P + c * B + d * K + e * Q + m * (1 - (1 - k / E) ** (P + B))

and each request waits ``r`` after it arrives before the scheduler can take it (``request_overhead_s``:
tokenization and the hand-off to the scheduler; in its TTFT, but no step's cost).

* ``a``: fixed per-step cost: the calibrated step overhead (launches, scheduling, sampling: it does
  not scale with bandwidth), two all-reduces per layer when TP > 1 (each a fitted cost per peer rank),
  one read of the weights every token uses (all of a dense model; attention, shared experts and
  embeddings of a MoE), and with expert parallelism a dispatch + combine per MoE layer.
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
``agentsweep calibrate --fit``; ``docs/engine-sim.md`` shows the fit and its error); B200's and
MI355X's older serving-software generations have their own groups (``b200/fp4@pre-v0.5.9``,
``mi355x/fp4@pre-v0.5.9``), used only when asked for
(``engine-sim --calibration-generation``). A hardware x precision without published points uses the
defaults and says so at startup.

Hardware figures (vendor datasheets) are in ``HARDWARE`` below, each with its source; a model's shape
(layers, KV heads or MLA latent, experts, parameter counts, native precision) comes from its Hugging
Face ``config.json`` (:mod:`agentsweep.engine_sim.model_config`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from agentsweep.engine_sim.model_config import ModelShape, load_shape

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
    scale_up_bw: float = 900 * GB  # bytes/s per GPU over the scale-up fabric (NVLink, Infinity Fabric)
    # A calibrated hardware of the same kind whose fitted fractions (of this one's own peaks) stand in
    # where this one has no published point; the start-up line says so. "" = none (defaults).
    calibrated_like: str = ""


# Every figure is per GPU, dense (no sparsity), from the vendor's public datasheet or product page named
# beside it. Where a datasheet gives a whole system (HGX x8, NVL72), the figure is divided by its GPUs.
# Idle power is in no datasheet. Recorded with nvidia-smi (tests/energy/fixtures): an H100 (700 W board)
# idles at 71 W bare and at 120-127 W once a process holds a CUDA context and memory, as a serving engine
# does; an H200 idles at 80 W bare and draws about 691 W of its 700 W limit under a bf16 matmul loop. The
# H200 takes the held-context 125 W, the others the same 18 % of their board power (an estimate until
# they are measured). Host links: PCIe Gen5 x16 is 64 GB/s per direction raw, ~50 GB/s for pinned
# copies; PCIe Gen6 x16 twice that; Grace's NVLink-C2C 900 GB/s (450 per direction) shared by two GPUs.
HARDWARE: dict[str, Hardware] = {
    # NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, FP8 3,958 TFLOPS with sparsity (1,979 dense),
    # BF16 989 dense; "Max TDP up to 700W (configurable)"; NVLink 900 GB/s. No FP4 units: FP4 weights
    # compute at the FP8 rate.
    "h200": Hardware(
        "h200", 141 * GB, 4.8e12, {"bf16": 989e12, "fp8": 1979e12, "fp4": 1979e12}, 50 * GB,
        board_power_w=700.0, idle_power_w=125.0, scale_up_bw=900 * GB,
    ),
    # NVIDIA HGX B200 datasheet (per GPU of 8): 180 GB HBM3e, 8 TB/s, FP4 9 PFLOPS dense, FP8 4.5,
    # BF16 2.25; up to 1,000 W per GPU; NVLink 5 1.8 TB/s; PCIe Gen5 host link.
    "b200": Hardware(
        "b200", 180 * GB, 8.0e12, {"bf16": 2.25e15, "fp8": 4.5e15, "fp4": 9.0e15}, 50 * GB,
        board_power_w=1000.0, idle_power_w=180.0, scale_up_bw=1800 * GB,
    ),
    # NVIDIA HGX B300 datasheet (Blackwell Ultra, per GPU of 8): 2.3 TB HBM3e per system = 288 GB per
    # GPU, 8 TB/s; FP4 108 PFLOPS dense per system = 13.5 per GPU; FP8 4.5 and BF16 2.25 dense (as B200);
    # 1,100 W per GPU; NVLink 5 1.8 TB/s; PCIe Gen6 host link.
    "b300": Hardware(
        "b300", 288 * GB, 8.0e12, {"bf16": 2.25e15, "fp8": 4.5e15, "fp4": 13.5e15}, 100 * GB,
        board_power_w=1100.0, idle_power_w=200.0, scale_up_bw=1800 * GB, calibrated_like="b200",
    ),
    # NVIDIA GB200 NVL72 datasheet (per GPU of 72): 13.4 TB HBM3e = 186 GB per GPU, 576 TB/s = 8 TB/s per
    # GPU; FP4 720 PFLOPS dense = 10 per GPU, FP8 360 = 5, BF16 180 = 2.5; NVLink 5 1.8 TB/s per GPU.
    # Power: 1,200 W per Blackwell GPU in the GB200 superchip (NVIDIA's GB200 configuration guides);
    # host link NVLink-C2C to Grace.
    "gb200": Hardware(
        "gb200", 186 * GB, 8.0e12, {"bf16": 2.5e15, "fp8": 5.0e15, "fp4": 10.0e15}, 200 * GB,
        board_power_w=1200.0, idle_power_w=215.0, scale_up_bw=1800 * GB, calibrated_like="b200",
    ),
    # NVIDIA GB300 NVL72 datasheet (per GPU of 72): up to 20.7 TB HBM3e = 288 GB per GPU, 576 TB/s = 8 TB/s
    # per GPU; FP4 1,080 PFLOPS dense = 15 per GPU, FP8 360 = 5, BF16 180 = 2.5; NVLink 5 1.8 TB/s per GPU.
    # Power: 1,400 W per Blackwell Ultra GPU (NVIDIA GB300 configuration guides); NVLink-C2C to Grace.
    "gb300": Hardware(
        "gb300", 288 * GB, 8.0e12, {"bf16": 2.5e15, "fp8": 5.0e15, "fp4": 15.0e15}, 200 * GB,
        board_power_w=1400.0, idle_power_w=250.0, scale_up_bw=1800 * GB, calibrated_like="b200",
    ),
    # AMD Instinct MI325X data sheet: 256 GB HBM3E, 6 TB/s; FP8 2,614.9 TFLOPS dense (5,229.8 with
    # sparsity), FP16/BF16 1,307.4 dense; no FP4 units (FP4 weights compute at the FP8 rate); 1,000 W
    # total board power; Infinity Fabric 896 GB/s (7 links x 128 GB/s); PCIe Gen5 host link.
    "mi325x": Hardware(
        "mi325x", 256 * GB, 6.0e12, {"bf16": 1.3074e15, "fp8": 2.6149e15, "fp4": 2.6149e15}, 50 * GB,
        board_power_w=1000.0, idle_power_w=180.0, scale_up_bw=896 * GB, calibrated_like="mi355x",
    ),
    # AMD Instinct MI355X data sheet: 288 GB HBM3E, 8 TB/s; FP8 ~5 PFLOPS dense (~2.5 FP16), MXFP4 ~10;
    # 1,400 W total board power (the air-cooled MI350X is 1,000 W); Infinity Fabric 1,075 GB/s (7 links x
    # 153.6 GB/s); PCIe Gen5 host link.
    "mi355x": Hardware(
        "mi355x", 288 * GB, 8.0e12, {"bf16": 2.5e15, "fp8": 5.0e15, "fp4": 10.0e15}, 50 * GB,
        board_power_w=1400.0, idle_power_w=250.0, scale_up_bw=1075 * GB,
    ),
}  # fmt: skip

ACTIVATION_RESERVE_BYTES = 4 * GB  # per GPU: activations, CUDA graphs, workspace
# One small all-reduce per peer rank before it was fitted: the constant 12 us it replaced, at TP 8.
ALLREDUCE_PEER_S = 12e-6 / 7


@dataclass(frozen=True, slots=True)
class Efficiency:
    """The calibrated coefficients of one hardware x precision (see the module docstring)."""

    step_overhead_s: float  # fixed time per step that does not scale with bandwidth
    hbm_eff: float  # achieved fraction of the HBM bandwidth (weights, KV)
    mfu: float  # achieved fraction of the dense peak FLOPS (prefill and decode compute)
    prefill_overhead_s: float  # extra fixed time of a step that prefills
    # Time from a request's arrival until the scheduler can take it (tokenization, the hand-off to the
    # scheduler process): adds to its TTFT but, unlike a step cost, stalls no other request.
    request_overhead_s: float = 0.0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Efficiency:
        return cls(
            float(d["step_overhead_s"]),
            float(d["hbm_eff"]),
            float(d["mfu"]),
            float(d["prefill_overhead_s"]),
            float(d.get("request_overhead_s", 0.0)),
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "step_overhead_s": self.step_overhead_s,
            "hbm_eff": self.hbm_eff,
            "mfu": self.mfu,
            "prefill_overhead_s": self.prefill_overhead_s,
            "request_overhead_s": self.request_overhead_s,
        }


@dataclass(frozen=True, slots=True)
class Shared:
    """Coefficients fitted over all hardware together (too few points to tell hardware apart)."""

    per_seq_s: float  # bookkeeping per decoding sequence per step
    ep_layer_s: float  # expert-parallel dispatch + combine, per MoE layer per step
    # One small all-reduce (two per layer when TP > 1) costs this per peer rank: each rank reads the other
    # TP - 1 ranks' partial sums, so TP 8 pays more than TP 4.
    allreduce_peer_s: float = ALLREDUCE_PEER_S

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Shared:
        """From calibration.json; a file written before the all-reduce was fitted has the constant."""
        return cls(
            float(d["per_seq_s"]),
            float(d["ep_layer_s"]),
            float(d.get("allreduce_peer_s", ALLREDUCE_PEER_S)),
        )

    def to_dict(self) -> dict[str, float]:
        return {f.name: round(float(getattr(self, f.name)), 12) for f in dataclasses.fields(self)}


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
    borrowed: Calibration | None = None  # the calibration of the hardware this one is like
    images: tuple[str, ...] = ()  # the serving images of its points ("unstated" where a point names none)

    def describe(self, model_key: str) -> str:
        if self.borrowed is not None:
            kin = self.borrowed
            return (
                f"calibration {self.key}: no published point; extrapolated with the fractions fitted on "
                f"{kin.key} ({kin.points} published {kin.model} points) applied to {self.key.split('/')[0]}'s "
                f"own datasheet peaks"
                + (f", and from {kin.model} to {model_key}" if model_key != kin.model else "")
            )
        if not self.points:
            return f"calibration {self.key}: no published data, default coefficients ({self.source})"
        text = (
            f"calibration {self.key}: fitted to {self.points} published {self.model} points ({self.source}"
            + (f"; images: {', '.join(self.images)}" if self.images else "")
            + ")"
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
    shared = Shared.from_dict(data["shared"])
    out: dict[str, Calibration] = {}
    for key, group in data["groups"].items():
        out[key] = Calibration(
            key,
            Efficiency.from_dict(group["coefficients"]),
            shared,
            len(group.get("points", [])),
            str(data.get("source", "?")),
            str(group.get("model", "")),
            images=tuple(str(i) for i in group.get("images", [])),
        )
    return out


# The measures each published point holds and the fit predicts, in calibration.json's order.
MEASURES = ("tput_per_gpu", "median_intvty", "median_ttft_s")


def median_errors(pairs: Iterable[tuple[Sequence[float], Sequence[float]]]) -> list[float]:
    """Per measure (``MEASURES``' order), the median of |predicted / published - 1| over the
    (predicted, published) pairs; NaN for a measure with no finite error."""
    errors: list[list[float]] = [[] for _ in MEASURES]
    for predicted, published in pairs:
        for k, (pred, meas) in enumerate(zip(predicted, published, strict=True)):
            if math.isfinite(pred) and meas:
                errors[k].append(abs(pred / meas - 1.0))
    return [statistics.median(e) if e else math.nan for e in errors]


@cache
def held_out_errors(key: str, path: str = str(CALIBRATION_FILE)) -> dict[str, float] | None:
    """The median leave-one-out error of a calibration group (``hardware/precision``) per measure:
    |prediction with the point left out of the fit / published - 1| over its points. None when the
    group has no point with a leave-one-out prediction."""
    file = Path(path)
    if not file.is_file():
        return None
    group = json.loads(file.read_text())["groups"].get(key, {})
    pairs = [
        (p["loo_pred"], [float(p[m]) for m in MEASURES]) for p in group.get("points", []) if p.get("loo_pred")
    ]
    medians = dict(zip(MEASURES, median_errors(pairs), strict=True))
    found = {m: v for m, v in medians.items() if math.isfinite(v)}
    return found or None


class UnknownCalibrationError(ValueError):
    """A software generation calibration.json holds no coefficients for."""


def calibration_generations(hardware: str, precision: str) -> list[str]:
    """The older serving-software generations calibration.json holds for ``hardware/precision``
    (group keys ``hardware/precision@generation``); the plain key is the current one."""
    prefix = f"{hardware}/{precision}@"
    return sorted(k[len(prefix) :] for k in load_calibrations() if k.startswith(prefix))


def calibration_for(hardware: str, precision: str, generation: str = "") -> Calibration:
    """The coefficients of ``hardware/precision`` (of an older software ``generation`` when one is
    named: it must be in calibration.json): its own fit, else the fit of the calibrated hardware it is
    like (the same fractions of its own peaks, said at start-up), else the defaults."""
    key = f"{hardware}/{precision}"
    cals = load_calibrations()
    if generation:
        older = cals.get(f"{key}@{generation}")
        if older is None:
            known = ", ".join(calibration_generations(hardware, precision)) or "none"
            raise UnknownCalibrationError(
                f"no calibration {key}@{generation} (older generations of {key}: {known})"
            )
        return older
    found = cals.get(key)
    if found is not None:
        return found
    like = HARDWARE[hardware].calibrated_like if hardware in HARDWARE else ""
    kin = cals.get(f"{like}/{precision}") if like else None
    if kin is not None:
        return Calibration(key, kin.efficiency, kin.shared, 0, kin.source, kin.model, borrowed=kin)
    shared = next(iter(cals.values())).shared if cals else DEFAULT_SHARED
    why = "not in calibration.json" if cals else "calibration.json missing"
    return Calibration(key, DEFAULT_EFFICIENCY, shared, 0, why)


Model = ModelShape  # the step and memory models read a model's shape (model_config.py)


def _attn_pair_flops(layers: int, heads: int, qk_dim: int, v_dim: int) -> float:
    return 2.0 * layers * heads * (qk_dim + v_dim)


_BYTES_PER_PARAM = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}  # fp4 incl. block scales


def precision_of(name: str, native: str) -> str:
    """The weights precision a name states (``-FP8``, ``NVFP4``, ``W8A8``), else the config's."""
    low = name.lower()
    if re.search(r"(nv|mx)?fp4|w4a", low):
        return "fp4"
    if re.search(r"fp8|w8a8", low):
        return "fp8"
    return native


def generic_model(name: str) -> Model:
    """A dense GQA profile guessed from a ``<N>B`` in the name (8B when there is none): for a model
    whose config.json is nowhere to be found (the start-up line says so)."""
    m = re.search(r"(\d+(?:\.\d+)?)b(?![a-z])", name.lower())
    params = float(m.group(1)) * 1e9 if m else 8e9
    layers = 32 if params < 15e9 else 64 if params < 40e9 else 80
    heads = 32 if params < 15e9 else 64
    return ModelShape(
        key=f"generic-{params / 1e9:g}b", source="no config.json found: a dense model guessed from the name",
        total_params=params, active_params=params, routed_expert_params=0.0, layers=layers, kv_heads=8,
        head_dim=128, mla_dim=0, max_model_len=131072, native_precision="bf16", dense_precision="bf16",
        all_layers=layers, experts=0, experts_per_token=0, moe_layers=0,
        attn_flops_per_pair=_attn_pair_flops(layers, heads, 128, 128),
    )  # fmt: skip


def find_model(name: str) -> Model:
    """The shape of ``name`` from its config.json (local directory, Hugging Face cache, shipped), or a
    guess from its name when there is none."""
    return load_shape(name) or generic_model(name)


# The step model's coefficients by their names in the module docstring -> StepCost's fields.
STEP_COEFFICIENTS = {
    "a": "a", "a_p": "prefill_a", "b": "b", "c": "c", "d": "d", "e": "e", "m": "moe_s", "r": "admit_s",
}  # fmt: skip


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
    admit_s: float = 0.0  # a request's wait before the scheduler can take it (no step cost)

    def time(
        self, prefill_tokens: int, decode_batch: int, kv_tokens_read: int, attn_pairs: float = 0.0
    ) -> float:
        t = self.a + self.b * prefill_tokens + self.c * decode_batch + self.d * kv_tokens_read
        if prefill_tokens:
            t += self.prefill_a + self.e * attn_pairs
        if self.moe_s:
            t += self.moe_s * (1.0 - self.miss ** (prefill_tokens + decode_batch))
        return t

    def with_coefficients(self, given: dict[str, float]) -> StepCost:
        """These coefficients (named as in the module docstring: a, a_p, b, c, d, e, m, r) set, in
        seconds, instead of the profile's: a device described by its measured step times."""
        fields = {STEP_COEFFICIENTS[name]: value for name, value in given.items()}
        return dataclasses.replace(self, **fields)

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

    FP4 checkpoints of MoE models quantize the routed experts; the other weights keep the checkpoint's
    precision for them (FP8, or BF16 for gpt-oss's MXFP4), FP8 when FP4 is asked of another checkpoint.
    """
    per_param = _BYTES_PER_PARAM[precision]
    expert = model.routed_expert_params
    dense_per_param = per_param
    if expert and precision == "fp4":
        dense = model.dense_precision if model.native_precision == "fp4" else "fp8"
        dense_per_param = _BYTES_PER_PARAM[dense]
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
        a += 2 * n_layers_all * shared.allreduce_peer_s * (tp - 1)
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
        admit_s=eff.request_overhead_s,
    )


def deploy(
    model_name: str,
    hardware: str,
    tp: int,
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
    ep: int = 1,
    calibration: Calibration | None = None,
    generation: str = "",
) -> Deployment:
    hw = HARDWARE[hardware]
    model = find_model(model_name)
    precision = (
        quantization if quantization in _BYTES_PER_PARAM else precision_of(model_name, model.native_precision)
    )
    kv_dtype_bytes = 1 if kv_cache_dtype.startswith("fp8") else 2
    if model.mla_dim:
        kv_gpu = model.layers * model.mla_dim * kv_dtype_bytes  # latent replicated on each rank
        kv_gpu += model.layers * model.indexer_bytes  # a sparse-attention indexer's keys (FP8), likewise
    else:
        heads_gpu = max(1, model.kv_heads // tp)
        kv_gpu = model.layers * 2 * heads_gpu * model.head_dim * kv_dtype_bytes
    dense_bytes, expert_bytes = weight_bytes(model, precision)
    weight_total = dense_bytes + expert_bytes
    if model.checkpoint_bytes and precision == model.native_precision:
        weight_total = model.checkpoint_bytes  # the safetensors index states what the checkpoint holds
    weight_gpu = weight_total / tp  # EP splits the experts over the same GPUs
    cal = calibration or calibration_for(hardware, precision, generation)
    cost = step_cost(model, hw, tp, ep, precision, kv_gpu, cal)
    return Deployment(model, hw, tp, precision, kv_dtype_bytes, kv_gpu, weight_gpu, cost, ep, cal)
