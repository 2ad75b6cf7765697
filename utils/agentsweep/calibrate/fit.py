"""Fitting the step model's coefficients to published points (``agentsweep calibrate --fit``).

Per hardware x precision (B200 and MI355X: also per serving-software generation, ``Point.group``) five
coefficients (step overhead, achieved HBM fraction, MFU, prefill-step overhead, request overhead before
the scheduler takes a request); over all hardware three (per-sequence bookkeeping, expert-parallel cost
per MoE layer, all-reduce cost per peer rank). The
objective is the mean absolute log error of the three measures (throughput per GPU, median
interactivity, median TTFT) over the points, as predicted by the closed-loop stand-in
(:mod:`agentsweep.calibrate.steady`), plus a weak pull of each coefficient toward the defaults so a
hardware with few points stays physical. Minimized by Nelder-Mead in a transformed space that keeps
every coefficient in its physical range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from agentsweep.calibrate.points import Point
from agentsweep.calibrate.steady import KV_CACHE_DTYPE, Prediction, point_figures
from agentsweep.engine_sim.profiles import (
    DEFAULT_EFFICIENCY,
    DEFAULT_SHARED,
    Calibration,
    Efficiency,
    Shared,
    deploy,
)

PRIOR_WEIGHT = 0.02  # per coefficient, on its log distance from the default (a weak pull)
ROUNDS = 2  # alternations between the per-hardware and the shared coefficients
# The request overhead is fitted on a linear scale in units of this (its prior pulls toward 0, not a log).
REQUEST_SCALE_S = 0.1


def predict(p: Point, eff: Efficiency, shared: Shared, seed: int = 0) -> Prediction:
    """The stand-in's figures for a point (``seed`` draws the output lengths)."""
    cal = Calibration(p.group, eff, shared, 0, "fit")
    dep = deploy(p.model, p.hardware, p.tp, KV_CACHE_DTYPE, p.precision, ep=p.ep, calibration=cal)
    return point_figures(p, dep.cost, seed=seed)


def log_errors(p: Point, pred: Prediction) -> tuple[float, float, float]:
    return (
        math.log(pred.tput_per_gpu / p.tput_per_gpu),
        math.log(pred.median_intvty / p.median_intvty),
        math.log(pred.median_ttft_s / p.median_ttft_s),
    )


# -- coefficient <-> unconstrained vector ------------------------------------------------------------


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def eff_to_x(e: Efficiency) -> np.ndarray:
    return np.array(
        [
            math.log(e.step_overhead_s),
            _logit(e.hbm_eff),
            _logit(e.mfu),
            math.log(max(e.prefill_overhead_s, 1e-5)),
            e.request_overhead_s / REQUEST_SCALE_S,  # linear: zero is a physical value
        ]
    )


def x_to_eff(x: np.ndarray) -> Efficiency:
    return Efficiency(
        step_overhead_s=min(math.exp(x[0]), 0.1),
        hbm_eff=min(max(_sig(x[1]), 0.02), 0.98),
        mfu=min(max(_sig(x[2]), 0.005), 0.95),
        prefill_overhead_s=min(math.exp(x[3]), 2.0),
        request_overhead_s=min(max(float(x[4]) * REQUEST_SCALE_S, 0.0), 2.0),
    )


def shared_to_x(s: Shared) -> np.ndarray:
    return np.array([math.log(s.per_seq_s), math.log(s.ep_layer_s), math.log(s.allreduce_peer_s)])


def x_to_shared(x: np.ndarray) -> Shared:
    return Shared(
        per_seq_s=min(math.exp(x[0]), 1e-3),
        ep_layer_s=min(math.exp(x[1]), 1e-3),
        allreduce_peer_s=min(math.exp(x[2]), 1e-4),
    )


# The shared coefficients the prior pulls toward their defaults (the all-reduce cost; the older two were
# fitted without one and are far from theirs).
_SHARED_PRIOR_DIMS = [2]


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.5, iters: int = 400
) -> np.ndarray:
    """Plain Nelder-Mead (no dependency beyond numpy); returns the best vertex."""
    n = len(x0)
    simplex = [x0.astype(float)] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] < 1e-7 and np.max(np.abs(simplex[-1] - simplex[0])) < 1e-4:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        xr = centroid + (centroid - worst)
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - worst)
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (worst - centroid) if fr >= values[-1] else centroid + 0.5 * (xr - centroid)
            fc = f(xc)
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    found: np.ndarray = simplex[int(np.argmin(values))]
    return found


def _loss(points: Sequence[Point], eff_of: Callable[[Point], Efficiency], shared: Shared) -> float:
    total = 0.0
    for p in points:
        try:
            total += sum(abs(e) for e in log_errors(p, predict(p, eff_of(p), shared)))
        except (ValueError, ZeroDivisionError, OverflowError):
            return math.inf
    if math.isnan(total):  # a figure the stand-in could not measure
        return math.inf
    return total / max(1, len(points))


_PRIOR_X = eff_to_x(DEFAULT_EFFICIENCY)
_SHARED_PRIOR_X = shared_to_x(DEFAULT_SHARED)
SHARED_ITERS = 60  # Nelder-Mead iterations over the three shared coefficients per round


def fit_group(points: Sequence[Point], shared: Shared, start: Efficiency) -> Efficiency:
    """All five coefficients at once. A TTFT the steps and the recipe's receive interval do not explain
    (B200's published TTFTs are 0.4-0.7 s for 1k prompts where H200's are 0.09 s) can go into the request
    overhead, a wait that delays only its own request, or into the prefill-step overhead, which stalls
    every decode of that step as well; fitted together, throughput and interactivity decide between them
    (fitted one after the other, the step coefficients had already taken the TTFT into the prefill
    step)."""

    def objective(x: np.ndarray) -> float:
        eff = x_to_eff(x)
        return _loss(points, lambda _p: eff, shared) + PRIOR_WEIGHT * float(np.sum((x - _PRIOR_X) ** 2))

    x = eff_to_x(start)
    for step, iters in ((1.0, 250), (0.3, 120)):  # a restart from the best point escapes a collapsed simplex
        x = _minimize_over(objective, x, [0, 1, 2, 3, 4], step, iters)
    return x_to_eff(x)


def _minimize_over(
    f: Callable[[np.ndarray], float], x: np.ndarray, dims: list[int], step: float, iters: int
) -> np.ndarray:
    """Nelder-Mead over the coordinates ``dims`` of ``x``, the others held."""

    def sub(y: np.ndarray) -> float:
        full = x.copy()
        full[dims] = y
        return f(full)

    out = x.copy()
    out[dims] = nelder_mead(sub, x[dims], step=step, iters=iters)
    return out


@dataclass(slots=True)
class FitResult:
    groups: dict[str, Efficiency]
    shared: Shared


def fit(
    points: Sequence[Point],
    start: FitResult | None = None,
    shared_fixed: bool = False,
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """Every group's coefficients and the shared ones; ``progress`` gets a line per group fitted (a
    fit takes minutes)."""
    by_group: dict[str, list[Point]] = {}
    for p in points:
        by_group.setdefault(p.group, []).append(p)
    groups = {g: _start_of(g, start) for g in by_group}
    shared = start.shared if start else DEFAULT_SHARED
    rounds = 1 if shared_fixed else ROUNDS
    for r in range(rounds):
        for k, (g, pts) in enumerate(by_group.items(), 1):
            if progress is not None:
                progress(f"round {r + 1}/{rounds}: group {k}/{len(by_group)} {g} ({len(pts)} points)")
            groups[g] = fit_group(pts, shared, groups[g])
        if shared_fixed:
            break
        if progress is not None:
            progress(f"round {r + 1}/{rounds}: the shared coefficients")

        def f(x: np.ndarray) -> float:
            pull = PRIOR_WEIGHT * float(np.sum((x - _SHARED_PRIOR_X)[_SHARED_PRIOR_DIMS] ** 2))
            return _loss(points, lambda p: groups[p.group], x_to_shared(x)) + pull

        shared = x_to_shared(nelder_mead(f, shared_to_x(shared), step=1.0, iters=SHARED_ITERS))
    return FitResult(groups, shared)


def _start_of(group: str, start: FitResult | None) -> Efficiency:
    """Where a group's fit starts: its own coefficients, else (a new software generation) those of its
    hardware/precision, else the defaults."""
    if start is None:
        return DEFAULT_EFFICIENCY
    return start.groups.get(group) or start.groups.get(group.split("@")[0]) or DEFAULT_EFFICIENCY


def leave_one_out(
    points: Sequence[Point], full: FitResult, progress: Callable[[str], None] | None = None
) -> list[tuple[Point, Prediction]]:
    """Each point predicted by its group's coefficients refitted without it (shared ones kept). The
    only point of its group (an older software generation's) is predicted by its hardware/precision's
    current coefficients, the nearest the remaining data come to it."""
    out = []
    for i, p in enumerate(points):
        if progress is not None:
            progress(f"leave-one-out {i + 1}/{len(points)}: {p.group}")
        rest = [q for j, q in enumerate(points) if j != i and q.group == p.group]
        if rest:
            eff = fit_group(rest, full.shared, full.groups[p.group])
        else:
            eff = full.groups.get(p.group.split("@")[0], DEFAULT_EFFICIENCY)
        out.append((p, predict(p, eff, full.shared)))
    return out
