"""`agentsweep engine-sim MODEL ...`: the simulated engine's command line, shaped like `vllm serve`.

SGLang spellings are accepted where they map cleanly (--model-path, --tp-size,
--disable-radix-cache, --enable-hierarchical-cache with --hicache-size / --hicache-ratio /
--hicache-write-policy, --chunked-prefill-size, --max-running-requests, --scheduler-recv-interval,
--mem-fraction-static, --context-length). The dialect picks the cache policy: vLLM's (kv_cache.py) or
SGLang's (radix_cache.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agentsweep.engine_sim import disagg
from agentsweep.engine_sim.disagg import Disagg, DisaggConfig
from agentsweep.engine_sim.faults import Faults
from agentsweep.engine_sim.kv_cache import KVCache
from agentsweep.engine_sim.metrics import DIALECTS, add_simulated_gpus
from agentsweep.engine_sim.profiles import (
    GIB,
    HARDWARE,
    STEP_COEFFICIENTS,
    Deployment,
    UnknownCalibrationError,
    deploy,
)
from agentsweep.engine_sim.radix_cache import DEFAULT_WRITE_POLICY, WRITE_POLICIES, SGLangCache
from agentsweep.engine_sim.scheduler import Engine, SimClock
from agentsweep.engine_sim.server import ServerConfig, SimServer
from agentsweep.errors import InputError

STATS_INTERVAL_S = 10.0
# The GPU simulated when --hardware is not given (a cell always gives it: its hardware).
DEFAULT_HARDWARE = "h200"
# The simulator allocates and frees many small objects per request and keeps few reference cycles:
# at the default threshold (700 net allocations) the cyclic collector ran hundreds of times a
# second and took about a tenth of the process's CPU. It runs this much less often (the objects that
# die young are freed by reference counting first), and never walks what startup built.
GC_THRESHOLD = 20_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    p = parser
    p.add_argument("model_tag", nargs="?", metavar="MODEL", help="model name (selects the model profile)")
    p.add_argument("--model", "--model-path", dest="model", help="model name (same as MODEL)")
    p.add_argument("--served-model-name", nargs="+", help="name(s) the API answers to (default: MODEL)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at startup)")
    p.add_argument(
        "--dialect", choices=DIALECTS, default="vllm", help="metrics, log and cache-policy dialect"
    )
    p.add_argument(
        "--hardware",
        choices=sorted(HARDWARE),
        default=None,
        help=f"the GPU simulated (default: {DEFAULT_HARDWARE}, and the start-up line says it was not given)",
    )
    p.add_argument("--tensor-parallel-size", "--tp-size", "--tp", "-tp", dest="tp", type=int, default=1)
    p.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="vLLM: experts spread over the TP ranks (EP = TP)",
    )
    p.add_argument(
        "--ep-size",
        "--expert-parallel-size",
        dest="ep",
        type=int,
        default=None,
        help="SGLang: EP size (divides TP)",
    )
    p.add_argument(
        "--speed", type=float, default=1.0, help="simulated clock runs F times faster than wall time"
    )
    p.add_argument(
        "--step-coefficients",
        default="",
        metavar="NAME=SECONDS,...",
        help="step-model coefficients to use instead of the profile's (a, a_p, b, c, d, e, m, r as in "
        "docs/engine-sim.md), e.g. a=0.011,b=0.0003,r=0.18 for a device described by measured step times",
    )
    p.add_argument("--block-size", "--page-size", dest="block_size", type=int, default=16)
    p.add_argument(
        "--gpu-memory-utilization", "--mem-fraction-static", dest="mem_util", type=float, default=0.9
    )
    p.add_argument(
        "--max-num-batched-tokens", "--chunked-prefill-size", dest="max_batched", type=int, default=8192
    )
    p.add_argument("--max-num-seqs", "--max-running-requests", dest="max_seqs", type=int, default=1024)
    p.add_argument(
        "--scheduler-recv-interval",
        dest="recv_interval",
        type=int,
        default=1,
        help="SGLang: while only decodes run, take new requests in every N steps",
    )
    p.add_argument("--max-model-len", "--context-length", dest="max_model_len", type=int, default=None)
    p.add_argument(
        "--num-gpu-blocks-override", type=int, default=None, help="fix the GPU pool size in blocks"
    )
    p.add_argument("--kv-cache-dtype", default="auto", help="auto | fp8 (fp8 halves KV bytes per token)")
    p.add_argument("--quantization", default=None, help="weights precision override: bf16 | fp8 | fp4")
    p.add_argument(
        "--calibration-generation",
        default="",
        help="step-model coefficients fitted to an older serving-software generation of this hardware "
        "(pre-v0.5.9 on b200 and mi355x: the runs of 2025; default: the current one)",
    )
    p.add_argument(
        "--kv-offloading-size", type=float, default=0.0, help="CPU offload tier, GiB over all ranks"
    )
    p.add_argument("--kv-offloading-backend", default="native", help="accepted (native | lmcache)")
    p.add_argument("--enable-hierarchical-cache", action="store_true", help="SGLang: enable the host tier")
    p.add_argument("--hicache-size", type=float, default=0.0, help="SGLang: host tier GiB per rank")
    p.add_argument("--hicache-ratio", type=float, default=2.0, help="SGLang: host tier / device pool")
    p.add_argument(
        "--hicache-write-policy",
        choices=WRITE_POLICIES,
        default=DEFAULT_WRITE_POLICY,
        help="SGLang: when a node is written to the host tier (--dialect sglang)",
    )
    p.add_argument(
        "--no-enable-prefix-caching",
        "--disable-radix-cache",
        dest="prefix_caching",
        action="store_false",
        help="disable prefix caching (no reuse, no offload)",
    )
    p.add_argument("--enable-prefix-caching", dest="prefix_caching", action="store_true")
    p.add_argument(
        "--enable-prompt-tokens-details", "--enable-cache-report", action="store_true", help="accepted"
    )
    p.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens when a request sets none")
    p.add_argument(
        "--request-log", default=None, help="write each finished request's simulated timeline here (JSONL)"
    )
    p.add_argument(
        "--disaggregation-mode",
        choices=disagg.MODES,
        default="null",
        help="disaggregated serving role: prefill or decode (null: serve whole requests)",
    )
    p.add_argument(
        "--disaggregation-bootstrap-port",
        type=int,
        default=disagg.DEFAULT_BOOTSTRAP_PORT,
        help="prefill: the port decodes rendezvous on for SGLang-style handoffs (0: a free port)",
    )
    p.add_argument(
        "--kv-transfer-gbs",
        type=float,
        default=disagg.DEFAULT_KV_TRANSFER_GBS,
        help="decode: prefill->decode fabric bandwidth per GPU, GB/s (times TP for the instance)",
    )
    p.add_argument(
        "--kv-transfer-latency-ms",
        type=float,
        default=disagg.DEFAULT_KV_TRANSFER_LATENCY_MS,
        help="decode: fixed cost of one KV handoff, ms of simulated time",
    )
    p.add_argument(
        "--kv-transfer-timeout",
        type=float,
        default=disagg.DEFAULT_KV_TRANSFER_TIMEOUT_S,
        help="simulated seconds a prefill holds blocks for its decode, and a decode waits for its prefill",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fail-rate", type=float, default=0.0, help="fault: fraction of requests answered 500")
    p.add_argument("--fail-after", type=int, default=None, help="fault: 500 for every request after the N-th")
    p.add_argument(
        "--stall-after", type=int, default=None, help="fault: responses after the N-th stop midway"
    )
    p.add_argument("--crash-after", type=int, default=None, help="fault: exit when request N+1 arrives")
    p.add_argument("--slow-start", type=float, default=0.0, help="fault: /health answers 503 for S seconds")
    p.set_defaults(prefix_caching=True)


@dataclass(slots=True)
class Setup:
    model: str
    deployment: Deployment
    gpu_blocks: int
    cpu_blocks: int
    max_model_len: int
    hardware: str  # the GPU simulated (a key of profiles.HARDWARE)
    hardware_given: bool  # False: --hardware was not given, and the start-up line says so


KV_CACHE_DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16", "half")  # plus every fp8* spelling


def _check(args: argparse.Namespace) -> None:
    def bad(flag: str, what: str) -> InputError:
        return InputError(f"engine-sim {flag}: {what}")

    # Floats first: NaN fails every comparison, so each range is written as what must hold.
    for flag, value, low, low_open, high in (
        ("--speed", args.speed, 0.0, True, math.inf),
        ("--gpu-memory-utilization", args.mem_util, 0.0, True, 1.0),
        ("--fail-rate", args.fail_rate, 0.0, False, 1.0),
        ("--kv-offloading-size", args.kv_offloading_size, 0.0, False, math.inf),
        ("--hicache-size", args.hicache_size, 0.0, False, math.inf),
        ("--hicache-ratio", args.hicache_ratio, 0.0, False, math.inf),
        ("--slow-start", args.slow_start, 0.0, False, math.inf),
        ("--kv-transfer-gbs", args.kv_transfer_gbs, 0.0, True, math.inf),
        ("--kv-transfer-latency-ms", args.kv_transfer_latency_ms, 0.0, False, math.inf),
        ("--kv-transfer-timeout", args.kv_transfer_timeout, 0.0, True, math.inf),
    ):
        above = value > low if low_open else value >= low
        if not (math.isfinite(value) and above and value <= high):
            span = f"{'(' if low_open else '['}{low:g}, {high:g}]" if math.isfinite(high) else ""
            rule = f"in {span}" if span else f"{'>' if low_open else '>='} {low:g} and finite"
            raise bad(flag, f"must be {rule}, got {value}")
    for flag, value in (
        ("--tensor-parallel-size", args.tp),
        ("--block-size", args.block_size),
        ("--max-num-batched-tokens", args.max_batched),
        ("--max-num-seqs", args.max_seqs),
        ("--default-max-tokens", args.default_max_tokens),
        ("--max-model-len", args.max_model_len),
        ("--num-gpu-blocks-override", args.num_gpu_blocks_override),
        ("--ep-size", args.ep),
        ("--scheduler-recv-interval", args.recv_interval),
    ):
        if value is not None and value < 1:
            raise bad(flag, f"must be >= 1, got {value}")
    for flag, port in (
        ("--port", args.port),
        ("--disaggregation-bootstrap-port", args.disaggregation_bootstrap_port),
    ):
        if not 0 <= port <= 65535:
            raise bad(flag, f"must be in 0..65535, got {port}")
    for flag in ("fail_after", "stall_after", "crash_after"):
        value = getattr(args, flag)
        if value is not None and value < 0:
            raise bad("--" + flag.replace("_", "-"), f"must be >= 0, got {value}")
    dtype = args.kv_cache_dtype
    if dtype not in KV_CACHE_DTYPES and not dtype.startswith("fp8"):
        raise bad("--kv-cache-dtype", f"expected auto, bfloat16, fp16 or fp8[_e4m3|_e5m2], got {dtype!r}")


def step_coefficients(text: str) -> dict[str, float]:
    """``--step-coefficients``: ``NAME=SECONDS`` pairs, comma separated (InputError naming a bad one)."""
    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in STEP_COEFFICIENTS:
            raise InputError(
                f"engine-sim --step-coefficients: {item!r} is not NAME=SECONDS with NAME one of "
                + ", ".join(STEP_COEFFICIENTS)
            )
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds >= 0):
            raise InputError(f"engine-sim --step-coefficients: {name}={value.strip()!r} is not seconds >= 0")
        out[name] = seconds
    return out


def resolve(args: argparse.Namespace) -> Setup:
    """Check the flags and size the GPU pool and the CPU tier."""
    model = args.model or args.model_tag
    if not model:
        raise InputError("engine-sim: a MODEL is required (positional or --model)")
    if args.model and args.model_tag and args.model != args.model_tag:
        raise InputError(f"engine-sim: MODEL {args.model_tag!r} and --model {args.model!r} disagree")
    _check(args)
    hardware = args.hardware or DEFAULT_HARDWARE
    if args.quantization not in (None, "bf16", "fp8", "fp4"):
        raise InputError(f"engine-sim --quantization: expected bf16, fp8 or fp4, got {args.quantization!r}")
    ep = args.ep or (args.tp if args.enable_expert_parallel else 1)
    if args.tp % ep:
        raise InputError(f"engine-sim --ep-size: {ep} must divide --tensor-parallel-size {args.tp}")
    try:
        dep = deploy(
            model,
            hardware,
            args.tp,
            args.kv_cache_dtype,
            args.quantization,
            ep=ep,
            generation=args.calibration_generation,
        )
    except UnknownCalibrationError as err:
        raise InputError(f"engine-sim --calibration-generation: {err}") from None
    coefficients = step_coefficients(args.step_coefficients)
    if coefficients:
        dep = dataclasses.replace(dep, cost=dep.cost.with_coefficients(coefficients))
    if args.num_gpu_blocks_override is not None:
        gpu_blocks = args.num_gpu_blocks_override
    else:
        gpu_blocks = dep.gpu_blocks(args.block_size, args.mem_util)
        if gpu_blocks < 1:
            raise InputError(
                f"engine-sim: {model} ({dep.precision}, {dep.weight_bytes_gpu / 1e9:.0f} GB of weights per GPU "
                f"at TP {args.tp}) leaves no KV cache room on {hardware} at --gpu-memory-utilization "
                f"{args.mem_util}; raise --tensor-parallel-size or set --num-gpu-blocks-override"
            )
    block_bytes = dep.kv_bytes_per_token_all * args.block_size
    cpu_bytes = args.kv_offloading_size * GIB
    if args.enable_hierarchical_cache:
        if args.hicache_size:
            cpu_bytes = args.hicache_size * GIB * args.tp
        else:
            cpu_bytes = args.hicache_ratio * gpu_blocks * block_bytes
    cpu_blocks = int(cpu_bytes // block_bytes) if args.prefix_caching else 0
    max_model_len = args.max_model_len or dep.model.max_model_len
    return Setup(model, dep, gpu_blocks, cpu_blocks, max_model_len, hardware, args.hardware is not None)


def build_server(args: argparse.Namespace, setup: Setup, clock: SimClock | None = None) -> SimServer:
    """Engine + HTTP app for resolved flags (the caller starts it); ``clock``: the engine's (default:
    the wall clock at ``--speed``)."""
    dep = setup.deployment
    block_bytes = dep.kv_bytes_per_token_all * args.block_size
    # The cache policy follows the dialect's engine: vLLM's block pool, or SGLang's radix cache.
    cache: KVCache
    if args.dialect == "sglang":
        cache = SGLangCache(
            setup.gpu_blocks,
            cpu_blocks=setup.cpu_blocks,
            prefix_caching=args.prefix_caching,
            block_bytes=block_bytes,
            write_policy=args.hicache_write_policy,
        )
    else:
        cache = KVCache(
            setup.gpu_blocks,
            cpu_blocks=setup.cpu_blocks,
            prefix_caching=args.prefix_caching,
            block_bytes=block_bytes,
        )
    engine = Engine(
        cache,
        dep.cost,
        clock if clock is not None else SimClock(args.speed),
        block_size=args.block_size,
        max_num_batched_tokens=args.max_batched,
        max_num_seqs=args.max_seqs,
        host_link_bw=dep.hardware.host_link_bw * args.tp,
        recv_interval=args.recv_interval,
    )
    role = Disagg(
        DisaggConfig(
            mode=args.disaggregation_mode,
            host=args.host,
            bootstrap_port=args.disaggregation_bootstrap_port,
            kv_transfer_gbs=args.kv_transfer_gbs,
            kv_transfer_latency_ms=args.kv_transfer_latency_ms,
            kv_transfer_timeout_s=args.kv_transfer_timeout,
        ),
        engine,
        speed=args.speed,
        tp=args.tp,
    )
    faults = Faults(
        fail_rate=args.fail_rate,
        fail_after=args.fail_after,
        stall_after=args.stall_after,
        crash_after=args.crash_after,
        slow_start=args.slow_start,
        seed=args.seed,
    )
    config = ServerConfig(
        model=setup.model,
        served_names=list(args.served_model_name or [setup.model]),
        dialect=args.dialect,
        max_model_len=setup.max_model_len,
        default_max_tokens=args.default_max_tokens,
        faults=faults,
    )
    server = SimServer(config, engine, role)
    server.gpu_exporter = add_simulated_gpus(server.registry, dep, setup.gpu_blocks, args.block_size, engine)
    return server


def _log(line: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"INFO {stamp} {line}", flush=True)


def model_lines(dep: Deployment) -> list[str]:
    """Where the model's shape came from and what was derived from it (KV bytes per token first)."""
    m = dep.model
    if m.mla_dim:
        attn = f"MLA latent {m.mla_dim} per layer"
        if m.indexer_bytes:
            attn += f" + {m.indexer_bytes} bytes of sparse-attention indexer keys (FP8)"
    else:
        attn = f"{m.kv_heads} KV heads x head dim {m.head_dim}"
    moe = (
        f", MoE {m.experts} routed experts ({m.experts_per_token} per token) in {m.moe_layers} layers"
        if m.experts
        else ""
    )
    lines = [
        f"[engine_sim] model config: {m.source}",
        f"[engine_sim] KV bytes per token: {dep.kv_bytes_per_token_all:,} over all ranks, "
        f"{dep.kv_bytes_per_token_gpu:,} per GPU ({m.layers} of {m.all_layers} layers keep a KV cache, {attn}, "
        f"KV {'fp8' if dep.kv_dtype_bytes == 1 else 'bf16'})",
        f"[engine_sim] parameters: {m.total_params / 1e9:.1f} B total, {m.active_params / 1e9:.1f} B active per "
        f"token{moe}; native precision {m.native_precision}",
    ]
    lines += attention_lines(dep)
    if m.unused_fields:
        lines.append(
            f"[engine_sim] model config fields not used by the simulator: {', '.join(m.unused_fields)}"
        )
    return lines


def attention_lines(dep: Deployment) -> list[str]:
    """Each kind of attention the model has and what it holds per GPU, then what of it the simulator
    does not model (a line only when there is something)."""
    m, mb = dep.model, 1e6
    if m.mla_dim:
        parts = [f"{m.layers} MLA layers (a latent of {m.mla_dim} per token, on every rank)"]
    else:
        parts = [f"{m.layers} full-attention layers ({m.kv_heads} KV heads x head dim {m.head_dim})"]
    missing = []
    if m.index_topk:
        parts.append(
            f"sparse: an indexer in each picks the top {m.index_topk:,} tokens for every query, from keys of "
            f"{m.indexer_bytes} bytes per token (FP8 and its scale; in the KV bytes per token)"
        )
        missing.append(
            f"sparse attention reads only {m.index_topk:,} tokens per query, but the step model reads and "
            f"computes attention over every cached token (overstated past {m.index_topk:,} tokens of context), "
            "and leaves the indexer's own scoring out"
        )
    if m.sliding_layers:
        heads = max(1, m.kv_heads // dep.tp)
        window = m.sliding_layers * 2 * heads * m.head_dim * dep.kv_dtype_bytes * m.sliding_window
        parts.append(
            f"{m.sliding_layers} sliding-window layers keep at most {m.sliding_window:,} tokens per sequence "
            f"({window / mb:.1f} MB per running sequence per GPU)"
        )
        missing.append(
            "the sliding-window layers' KV is not taken from the KV pool and their attention reads are not "
            "in the step time"
        )
    if m.linear_layers:
        state = m.linear_state_bytes / dep.tp
        parts.append(
            f"{m.linear_layers} linear-attention layers keep a fixed state, {state / mb:.1f} MB per sequence per "
            "GPU (recurrent FP32 + convolution), nothing per token"
        )
        missing.append(
            "the linear-attention state is not taken from the KV pool (the engines keep it in a pool of its "
            "own) and its per-step read is not in the step time"
        )
    lines = ["[engine_sim] attention: " + "; ".join(parts)]
    if missing:
        lines.append("[engine_sim] not modelled: " + "; ".join(missing))
    return lines


def startup_lines(args: argparse.Namespace, setup: Setup) -> list[str]:
    dep = setup.deployment
    tokens = setup.gpu_blocks * args.block_size
    conc = tokens / setup.max_model_len
    c = dep.cost
    default = "" if setup.hardware_given else " (the default: --hardware not given)"
    lines = [
        f"[engine_sim] simulated {setup.hardware.upper()}{default}, {args.dialect} engine: model={setup.model} "
        f"profile={dep.model.key} hardware={setup.hardware} tp={args.tp} ep={dep.ep} precision={dep.precision} "
        f"speed={args.speed:g}",
        f"[engine_sim] {dep.calibration.describe(dep.model.key)}" if dep.calibration else "",
        *model_lines(dep),
        f"[engine_sim] step time = {c.a * 1e3:.3f} ms (+ {c.prefill_a * 1e3:.3f} ms when prefilling) + "
        f"{c.b * 1e6:.3f} us/prefill token + {c.c * 1e6:.3f} us/decode seq + {c.d * 1e9:.3f} ns/KV token read + "
        f"{c.e * 1e12:.3f} ps/prefill attention pair"
        + (f" + {c.moe_s * 1e3:.3f} ms x share of routed experts touched" if c.moe_s else "")
        + f"; each request waits {c.admit_s * 1e3:.3f} ms before the scheduler can take it"
        + (f" (--step-coefficients {args.step_coefficients})" if args.step_coefficients else ""),
        f"[kv_cache_utils.py] GPU KV cache size: {tokens:,} tokens",
        f"[engine_sim] KV pool: {tokens:,} tokens ({setup.gpu_blocks:,} blocks of {args.block_size})",
        f"[kv_cache_utils.py] Maximum concurrency for {setup.max_model_len:,} tokens per request: {conc:.2f}x",
    ]
    if setup.cpu_blocks:
        lines.append(f"[engine_sim] CPU offload tier: {setup.cpu_blocks * args.block_size:,} tokens")
    if not args.prefix_caching:
        lines.append("[engine_sim] prefix caching disabled")
    lines = [line for line in lines if line]
    if args.dialect == "sglang":
        lines.append(
            f"KV Cache is allocated. #tokens: {tokens}, max_total_num_tokens={tokens}, "
            f"chunked_prefill_size={args.max_batched}, max_running_requests={args.max_seqs}, "
            f"context_len={setup.max_model_len}"
        )
    return lines


def settings_line(args: argparse.Namespace, setup: Setup, port: int) -> str:
    """What this engine runs with, as one JSON start-up line (a cell checks it against its label, as
    it reads vLLM's and SGLang's own start-up lines: agentsweep.cell.effective)."""
    settings = {
        "model": setup.model,
        "served_model_name": (args.served_model_name or [setup.model])[0],
        "host": args.host,
        "port": port,
        "dialect": args.dialect,
        "hardware": setup.hardware,
        "speed": args.speed,
        "step_coefficients": ",".join(
            f"{k}={v:g}" for k, v in step_coefficients(args.step_coefficients).items()
        ),
        "tp": args.tp,
        "ep": setup.deployment.ep,
        "precision": setup.deployment.precision,
        "prefix_caching": bool(args.prefix_caching),
        "kv_offload": setup.cpu_blocks > 0,
        "cpu_tier_tokens": setup.cpu_blocks * args.block_size,
        "gpu_kv_tokens": setup.gpu_blocks * args.block_size,
        "disaggregation_mode": args.disaggregation_mode,
    }
    return "[engine_sim] effective settings: " + json.dumps(settings, sort_keys=True)


async def _serve(args: argparse.Namespace, setup: Setup) -> int:
    from aiohttp import web

    server = build_server(args, setup)
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD)
    log_file = None
    if args.request_log:
        try:
            log_file = open(args.request_log, "w", buffering=1 << 16)  # noqa: SIM115 - closed at shutdown
        except OSError as err:
            raise InputError(f"engine-sim --request-log {args.request_log}: {err.strerror or err}") from None
        server.engine.request_log = log_file
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        sock.close()
        raise InputError(
            f"engine-sim --host/--port: cannot bind {args.host}:{args.port}: {err.strerror}"
        ) from None
    sock.listen(1024)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    for line in startup_lines(args, setup):
        _log(line)
    _log(settings_line(args, setup, port))
    if server.disagg.mode != "null":
        _log(server.disagg.describe(setup.deployment.kv_bytes_per_token_all, args.tp))
    url = f"http://{args.host}:{port}"
    _log(f"Starting {args.dialect} API server on {url}")
    print(f"INFO:     Started server process [{os.getpid()}]", flush=True)
    print("INFO:     Application startup complete.", flush=True)
    print(f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)", flush=True)
    if args.dialect == "sglang":
        _log("The server is fired up and ready to roll!")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stats_task = loop.create_task(_stats_logger(server, stop))
    await stop.wait()
    memo = server.prompt_memo
    e = server.engine
    if e.iterations:
        _log(
            f"Simulated clock: {e.iterations_late / e.iterations:.1%} of {e.iterations} engine steps were "
            f"already due when computed, on average {e.lag_wall_s / e.iterations * 1e3:.2f} ms (wall) late "
            "(the simulator's CPU was the limit for those; the others waited for their simulated time)"
        )
    _log(f"Shutting down ({memo.prompts} prompts, {memo.reused} extended an earlier one of their session)")
    stats_task.cancel()
    await runner.cleanup()
    if log_file is not None:
        server.engine.request_log = None
        log_file.close()
    return 0


async def _stats_logger(server: SimServer, stop: asyncio.Event) -> None:
    """A periodic line like vLLM's 'Avg prompt throughput ...' log (wall-clock rates)."""
    st = server.engine.stats
    last = (time.monotonic(), st.prompt_tokens, st.generation_tokens)
    while not stop.is_set():
        await asyncio.sleep(STATS_INTERVAL_S)
        now = (time.monotonic(), st.prompt_tokens, st.generation_tokens)
        span = now[0] - last[0]
        if now[1:] == last[1:] and not server.engine.num_running:
            last = now
            continue
        e = server.engine
        hit = st.prefix_hits / st.prefix_queries * 100 if st.prefix_queries else 0.0
        _log(
            f"Engine 000: Avg prompt throughput: {(now[1] - last[1]) / span:.1f} tokens/s, "
            f"Avg generation throughput: {(now[2] - last[2]) / span:.1f} tokens/s, Running: {e.num_running} reqs, "
            f"Waiting: {e.num_waiting} reqs, GPU KV cache usage: {e.kv.usage * 100:.1f}%, "
            f"Prefix cache hit rate: {hit:.1f}%"
        )
        last = now


def run(args: argparse.Namespace) -> int:
    setup = resolve(args)
    runner: Callable[[Coroutine[Any, Any, int]], int] = asyncio.run
    try:
        import uvloop  # optional, faster event loop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        pass
    try:
        return runner(_serve(args, setup))
    except KeyboardInterrupt:
        return 0
    finally:
        sys.stdout.flush()
