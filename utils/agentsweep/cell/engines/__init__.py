"""Engine recipes: how each engine is started for a cell, on each hardware, as plug-ins.

A recipe is a small object (:class:`EngineRecipe`) in a module of its own; ``RECIPES`` maps each
engine name of the cell contract to that module, imported only when a cell uses it. Adding an engine
is one module plus one line here (and its name in ``agentsweep.contract.cell.Engine``).

The cell's ``engine_args`` come after the recipe's own arguments, so an entry can override any
default; ``engine_env`` wins over the recipe's environment.
"""

from __future__ import annotations

import importlib
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from agentsweep.contract.cell import HARDWARE, Cell
from agentsweep.errors import InputError

# engine name (every name of agentsweep.contract.cell.Engine) -> module whose RECIPE starts it
RECIPES: dict[str, str] = {
    "vllm": "agentsweep.cell.engines.vllm",
    "sglang": "agentsweep.cell.engines.sglang",
    "sim": "agentsweep.cell.engines.sim",
}


@dataclass(frozen=True)
class EngineLaunch:
    """A resolved engine start: argv, extra environment, where to ask if it is up."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    notes: list[str] = field(default_factory=list)  # what the dry run should say of this start


@dataclass(frozen=True)
class PdRole:
    """One instance's part in a disaggregated prefill/decode cell (what its recipe adds to the command).

    ``bootstrap_port``: the prefill instance's rendezvous port (SGLang protocol; None where the engine
    has none). ``side_channel_port``: the KV connector's handshake port on this host (vLLM NIXL).
    ``kv_transfer_gbs``: the runner's KV transfer bandwidth per GPU for this placement (the simulated
    engine models the transfer with it; None leaves its default).
    """

    role: Literal["prefill", "decode"]
    bootstrap_port: int | str | None = None
    side_channel_port: int | str | None = None
    kv_transfer_gbs: float | None = None


@dataclass(frozen=True)
class LaunchSite:
    """Where and how one engine instance starts: the runner's hardware (None when it states none), its
    port (or a shell variable a launcher fills) and host, the interpreter of the cell's own processes,
    the environment the cell runs in, and the instance's role in a disaggregated cell (None otherwise)."""

    hardware: str | None
    port: int | str
    host: str = "127.0.0.1"
    python: str = sys.executable
    environ: Mapping[str, str] = field(default_factory=dict)
    pd: PdRole | None = None


class EngineRecipe(Protocol):
    """What the cell needs to know about one engine."""

    # Seconds allowed for start-up: pulling the image, loading weights, compiling (Slurm time limit).
    startup_margin_s: int
    # Seconds to wait for /health, and between SIGTERM and SIGKILL when stopping it.
    health_timeout_s: float
    stop_grace_s: float
    # True when the engine is simulated on the cell's own cores (no spare core for a polling client;
    # no tokenizer to load; its clock may run faster than real time).
    simulated: bool
    # Disaggregated cells: whether a prefill instance serves a bootstrap port (the router is told it),
    # and whether every instance needs a handshake port of its own on the host.
    pd_bootstrap: bool
    pd_side_channel: bool
    # Capacity cells: where a POST resets the prefix cache between steps (vLLM /reset_prefix_cache,
    # SGLang /flush_cache), and the seconds a step takes beyond its replay duration (warm-up requests,
    # the replayer's grace, the engine settling, the reset) for the step budget.
    cache_reset_path: str
    step_overhead_s: float

    def launch(self, cell: Cell, site: LaunchSite) -> EngineLaunch:
        """The engine's argv and environment (before the cell's engine_args and engine_env) at ``site``."""
        ...

    def version(self, base_url: str) -> str | None:
        """The running engine's version as it reports it, or None."""
        ...

    def kv_events_args(self, endpoint: str) -> list[str]:
        """The flags that make the engine publish its KV-cache events to ``endpoint`` (a ZMQ socket the
        cell's scraper binds), for an engine that counts evictions only that way; [] otherwise."""
        ...


class ServingEngine:
    """What vLLM and SGLang share: a long start (image, weights, graphs), a version over HTTP."""

    startup_margin_s = 1800
    health_timeout_s = 1800.0
    stop_grace_s = 30.0
    simulated = False
    pd_bootstrap = False
    pd_side_channel = False
    cache_reset_path = "/reset_prefix_cache"
    step_overhead_s = 120.0

    def kv_events_args(self, endpoint: str) -> list[str]:
        return []

    def version(self, base_url: str) -> str | None:
        from agentsweep.cell.engines.http_version import fetch_version

        # vLLM: /version. SGLang: /server_info (0.5.23; /get_server_info is deprecated there).
        return fetch_version(base_url, ("/version", "/server_info", "/get_server_info"))


def recipe(engine: str) -> EngineRecipe:
    """The registered recipe of ``engine`` (imported on first use)."""
    module_path = RECIPES.get(engine)
    if module_path is None:
        raise InputError(f"cell.engine: no recipe for {engine!r} (known: {', '.join(RECIPES)})")
    found: EngineRecipe = importlib.import_module(module_path).RECIPE
    return found


def build_engine_launch(
    cell: Cell,
    *,
    hardware: str | None,
    port: int | str,
    host: str = "127.0.0.1",
    python: str = sys.executable,
    environ: Mapping[str, str] | None = None,
    pd: PdRole | None = None,
) -> EngineLaunch:
    """The engine command for ``cell``; ``hardware`` is the runner's (None when it states none); ``pd``
    the instance's role in a disaggregated cell."""
    if hardware is not None and hardware not in HARDWARE:
        raise InputError(
            f"runner '{cell.runner}': unknown hardware {hardware!r}; expected one of {', '.join(HARDWARE)}"
        )
    site = LaunchSite(hardware, port, host, python, environ or {}, pd)
    launch = recipe(cell.engine).launch(cell, site)
    extra = _split_engine_args(cell.engine_args)
    env = {**launch.env, **cell.engine_env}
    return EngineLaunch(
        argv=launch.argv + extra,
        env=env,
        health_path=launch.health_path,
        metrics_path=launch.metrics_path,
        notes=launch.notes,
    )


def offload_gib(cell: Cell) -> float:
    """CPU DRAM (GiB) for KV offload of the whole cell; offload=on needs it > 0."""
    if cell.cpu_dram_gb <= 0:
        raise InputError(
            f"cell {cell.exp_name}: offload on needs cpu_dram_gb > 0 (got {cell.cpu_dram_gb:g}); "
            "set cpu_dram_gb for the runner in configs/runners.yaml"
        )
    return cell.cpu_dram_gb


def _split_engine_args(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as err:
        raise InputError(f"cell.engine_args: cannot split as shell words ({err})") from None


def fmt_gib(value: float) -> str:
    return fmt_num(round(value, 2))


def fmt_num(value: float) -> str:
    """1500.0 -> '1500', 187.5 -> '187.5', 0.025 -> '0.025' (no float noise on command lines)."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"
