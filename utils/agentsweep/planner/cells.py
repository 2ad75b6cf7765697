"""The capacity cells of a plan: one per hardware x TP x offload mode, each a simulated capacity search
on the virtual clock, built as a config entry is (``config.loader.parse_entry`` and ``matrix.expand``)
so that every check a sweep config gets applies here too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kv_cache_tester.replay.memory import MAX_PROMPT_TOKENS

from agentsweep.config.loader import load_runners, parse_entry
from agentsweep.config.matrix import expand
from agentsweep.contract.cell import HARDWARE, Cell
from agentsweep.contract.slo import SloTier, UserSearch
from agentsweep.errors import InputError
from agentsweep.virtual.run import kept_traces


@dataclass(frozen=True, slots=True)
class PlanSpec:
    """What a plan asks: one model on one trace set, per hardware, against SLO tiers."""

    model: str
    precision: str
    traces: str
    hardware: tuple[str, ...]
    tps: tuple[int, ...]
    offloads: tuple[str, ...]
    search: UserSearch
    tiers: tuple[SloTier, ...] | None
    duration: int  # each step's replay, in the cell's seconds (engine seconds / speed)
    speed: float
    max_context: int
    engine_args: str = ""
    # Data-parallel engines of ``tp`` GPUs each behind an in-process router (a rack: 9 x TP 8 = 72 GPUs);
    # agents per GPU count all of them.
    replicas: int = 1
    router: str = ""


# Replicas keep each agent's session on one engine, its prefix in that engine's cache.
DEFAULT_ROUTER = "consistent_hash"


def runner_key(hardware: str) -> str:
    return f"sim-{hardware}"


def plan_cells(spec: PlanSpec) -> list[Cell]:
    """The plan's capacity cells (InputError naming what is wrong: an unknown hardware, a TP the
    model does not fit...)."""
    unknown = [h for h in spec.hardware if h not in HARDWARE]
    if unknown:
        raise InputError(
            f"--hardware {unknown[0]}: no simulated profile of it; the profiles are {', '.join(HARDWARE)}"
        )
    runners = load_runners()
    cells: list[Cell] = []
    for hardware in spec.hardware:
        if runner_key(hardware) not in runners:
            raise InputError(f"--hardware {hardware}: runners.yaml has no runner {runner_key(hardware)}")
        entry = _entry(spec, hardware)
        where = f"plan ({hardware})"
        sweep = parse_entry(where, f"plan-{hardware}", entry)
        cells += expand(sweep, runners, slo=spec.tiers)
    return cells


def _entry(spec: PlanSpec, hardware: str) -> dict[str, Any]:
    low, high = spec.search.search
    point: dict[str, Any] = {
        "users": {"search": [low, high]},
        "offload": list(spec.offloads),
    }
    if spec.replicas > 1 or spec.router:
        point["replicas"] = spec.replicas
        point["router"] = [spec.router or DEFAULT_ROUTER]
    entry: dict[str, Any] = {
        "description": f"agentsweep plan: {spec.model} on simulated {hardware}",
        "runner": runner_key(hardware),
        "engine": "sim",
        "model": spec.model,
        "precision": spec.precision,
        "image": "",
        "duration": spec.duration,
        "speed": spec.speed,
        "clock": "virtual",
        "traces": spec.traces,
        "replay": {"max_context": spec.max_context},
        "search_space": {f"tp{tp}": point for tp in spec.tps},
    }
    if spec.engine_args:
        entry["engine_args"] = spec.engine_args
    return entry


def playable_traces(spec: PlanSpec) -> int:
    """How many traces each step's replay keeps (cut at ``max_context`` as the replayer cuts them). The
    replayer never plays one trace in two lanes at once: a step with more agents than this leaves the
    rest idle, and is judged INVALID for it. Loaded as the replay loads them and kept: the first step
    does not parse them again."""
    kept = kept_traces(
        spec.traces,
        max_context=spec.max_context or MAX_PROMPT_TOKENS,
        max_context_mode="truncate",
        min_requests=1,
    )
    return len(kept.traces)
