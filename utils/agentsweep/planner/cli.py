"""`agentsweep plan`: how many agents each hardware serves under SLO tiers, for one model on one trace
set, through simulated capacity searches on the virtual clock (docs/plan.md).

    agentsweep plan --model meta-llama/Llama-3.3-70B-Instruct --precision fp8 \\
        --hardware h200,b200,b300,gb300,mi355x --search 1:16 -o results/plan
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from agentsweep.cell.clients.replay import REPLAY_PLOT_VAR
from agentsweep.config import overrides
from agentsweep.contract.cell import HARDWARE, OFFLOAD_MODES, VIRTUAL_ROUTER_POLICIES
from agentsweep.contract.slo import UserSearch
from agentsweep.errors import InputError
from agentsweep.planner.cells import DEFAULT_ROUTER, PlanSpec, plan_cells, playable_traces
from agentsweep.planner.report import plan_rows, table_lines, write_plan
from agentsweep.planner.run import PlanInterrupted, run_searches

DEFAULT_SEARCH = UserSearch(search=(1, 16))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="meta-llama/Llama-3.3-70B-Instruct", help="the model (HF id)")
    parser.add_argument("--precision", default="fp8", help="weights precision (bf16, fp8, fp4)")
    parser.add_argument("--traces", default="kv-cache-tester/sample_traces", help="trace directory")
    parser.add_argument(
        "--hardware", default="h200,b200,b300,gb300,mi355x", help=f"comma list of {', '.join(HARDWARE)}"
    )
    parser.add_argument("--tp", default="1", help="tensor-parallel sizes to try (comma list)")
    parser.add_argument(
        "--offload", default="off", help="KV offload modes to try (comma list of on, off, noprefix)"
    )
    overrides.add_arguments(parser)  # --slo (default: the shipped tiers), --search LOW:HIGH (default 1:16)
    parser.add_argument(
        "--duration", type=int, default=12, help="each step's replay, in the cell's seconds (default 12)"
    )
    parser.add_argument(
        "--speed", type=float, default=50.0, help="engine seconds per cell second (default 50: 600 s a step)"
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engines of TP GPUs each per search, behind an in-process router (a rack: --tp 8 --replicas 9)",
    )
    parser.add_argument(
        "--router",
        default="",
        help=f"the router policy in front of the replicas ({', '.join(VIRTUAL_ROUTER_POLICIES)}; "
        f"default {DEFAULT_ROUTER})",
    )
    parser.add_argument("--max-context", type=int, default=65536, help="cut traces at this context (tokens)")
    parser.add_argument("--engine-args", default="", help="extra engine-sim flags for every search")
    parser.add_argument(
        "--budget-min",
        type=float,
        default=None,
        help="refuse a plan whose estimated time exceeds this (minutes)",
    )
    parser.add_argument("-o", "--output", type=Path, default=Path("results/plan"), help="output directory")


def spec_of(args: argparse.Namespace) -> PlanSpec:
    return PlanSpec(
        model=args.model,
        precision=args.precision,
        traces=args.traces,
        hardware=tuple(overrides.comma_list("--hardware", args.hardware, _word) or ()),
        tps=tuple(overrides.comma_list("--tp", args.tp, overrides.positive_int) or ()),
        offloads=tuple(overrides.comma_list("--offload", args.offload, _offload) or ()),
        search=overrides.user_search(args.search) or DEFAULT_SEARCH,
        tiers=overrides.slo_tiers(args.slo),
        duration=args.duration,
        speed=args.speed,
        max_context=args.max_context,
        engine_args=args.engine_args,
        replicas=_replicas(args.replicas),
        router=_router(args.router),
    )


def _replicas(value: int) -> int:
    if value < 1:
        raise InputError(f"--replicas {value}: expected a positive number of engines")
    return value


def _router(word: str) -> str:
    if word and word not in VIRTUAL_ROUTER_POLICIES:
        raise InputError(
            f"--router {word}: the virtual clock routes by {', '.join(VIRTUAL_ROUTER_POLICIES)}"
            " (cache_aware is the router program's own and needs clock: wall)"
        )
    return word


def _word(_flag: str, word: str) -> str:
    return word


def _offload(flag: str, word: str) -> str:
    if word not in OFFLOAD_MODES:
        raise InputError(f"{flag} {word}: expected one of {', '.join(OFFLOAD_MODES)}")
    return word


# Measured on 2 cores: a step of 12 cell seconds at speed 50 with up to 16 users takes about 1 s in
# this process; a search of 1..16 users about 8 steps.
STEP_S_ESTIMATE = 1.5


def estimate_s(n_searches: int, search: UserSearch, replicas: int = 1) -> float:
    """A rough upper estimate of the plan's wall time: bracketing then bisecting ``search``. A step's
    cost grows with its agents and its engines (9 x TP 8 GB300 engines, 600 engine seconds a step: 21 s
    at 32 agents, 45 s at 128, 68 s at 256)."""
    low, high = search.search
    steps = 2 * max(1, (high // max(1, low)).bit_length()) + 2
    return n_searches * steps * STEP_S_ESTIMATE * max(1.0, high / 16) * (1 + (replicas - 1) / 3)


def run(args: argparse.Namespace) -> int:
    # The plan draws its own figure; each step's replay plot would be most of a short step's CPU.
    os.environ.setdefault(REPLAY_PLOT_VAR, "off")
    spec = spec_of(args)
    cells = plan_cells(spec)
    playable = playable_traces(spec)
    low, high = spec.search.search
    if playable < low:
        raise InputError(
            f"--search {low}:{high}: {spec.traces} gives {playable} traces at --max-context {spec.max_context}, "
            f"and a trace is never live in two lanes: at most {playable} agents at once; give --traces a "
            f"set of at least {low} traces, or search lower"
        )
    estimate = estimate_s(len(cells), spec.search, spec.replicas)
    if args.budget_min is not None and estimate > args.budget_min * 60:
        raise InputError(
            f"--budget-min {args.budget_min:g}: {len(cells)} searches of {spec.search.search[0]}..{spec.search.search[1]} "
            f"users take about {estimate / 60:.0f} min; fewer --hardware, --tp or --offload values, a narrower "
            "--search or a shorter --duration fit"
        )

    def say(line: str) -> None:
        print(f"plan: {line}", file=sys.stderr, flush=True)

    say(
        f"{len(cells)} capacity searches on the virtual clock (at most about {estimate / 60:.0f} min) -> {args.output}"
    )
    if playable < high:
        say(
            f"{spec.traces} gives {playable} traces: a step of more agents leaves lanes idle and is judged "
            "INVALID (a trace is never live in two lanes)"
        )
    start = time.monotonic()
    cells_dir = args.output / "cells"
    code = 0
    try:
        run_searches(cells, cells_dir, say)
    except PlanInterrupted as err:
        say(f"{err}: the finished searches are kept; run the same command again to finish the plan")
        code = 130
    rows = plan_rows(cells, cells_dir)
    missing = len(cells) - len({r.exp_name for r in rows})
    if missing:
        say(f"{missing} of {len(cells)} searches did not finish: left out of the answer")
    if not rows:
        say("no search finished: nothing to report")
        return code or 1
    title = f"{spec.model} ({spec.precision}) on {', '.join(spec.hardware)}: agents per GPU under SLO"
    paths = write_plan(rows, args.output, title)
    for line in table_lines(rows):
        print(line, flush=True)
    say(f"done in {time.monotonic() - start:.0f} s: {', '.join(str(p) for p in paths)}")
    return code
