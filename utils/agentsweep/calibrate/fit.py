"""Fitting the step model's coefficients to published points (``agentsweep calibrate --fit``).

Per hardware x precision (B200 and MI355X: also per serving-software generation, ``Point.group``) three
coefficients (step overhead, achieved HBM fraction, MFU); per hardware's current serving software two
fixed latencies shared by its precisions (prefill-step overhead, request overhead before the scheduler
takes a request: ``Point.latency_family``; an older generation's groups keep their own); over all
hardware three (per-sequence bookkeeping, expert-parallel cost per MoE layer, all-reduce cost per peer
rank). The
objective is the mean absolute log error of the three measures (throughput per GPU, median
interactivity, median TTFT) over the points, as predicted by the closed-loop stand-in
(:mod:`agentsweep.calibrate.steady`), plus a weak pull of each coefficient toward the defaults so a
hardware with few points stays physical. Minimized by Nelder-Mead in a transformed space that keeps
every coefficient in its physical range.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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
from agentsweep.watchdog import set_parent_death_signal

_T = TypeVar("_T")
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


# A group's coordinates (``eff_to_x``) of its own, and those its latency family shares: the prefill-step
# overhead and the request overhead.
_OWN_DIMS = [0, 1, 2]
_TIED_DIMS = [3, 4]
# Nelder-Mead passes of a family's joint fit (3 coordinates per group and 2 shared: more than one group's 5)
FAMILY_PASSES = ((1.0, 400), (0.3, 200))


def fit_family(
    by_group: Mapping[str, Sequence[Point]],
    shared: Shared,
    starts: Mapping[str, Efficiency],
    passes: Sequence[tuple[float, int]] = FAMILY_PASSES,
) -> dict[str, Efficiency]:
    """The coefficients of the groups of one latency family, fitted together: each group its step
    overhead, HBM fraction and MFU, all of them one prefill-step overhead and one request overhead.

    Why shared: what a TTFT holds beyond the step model (the request's wait before the scheduler takes
    it, a prefill step's fixed cost) is the serving software's and the host's, not the weights'. Fitted
    per precision, a group whose points all ran under load (B200 FP4 of 2026: 16 to 128 users, the
    recipe taking requests in every 30 steps) put a quarter second into them that no point of its own
    could tell from queueing, and read single-user TTFTs far too high; its FP8 sibling's one-user row
    pins them."""
    names = list(by_group)
    if len(names) == 1:
        return {names[0]: fit_group(by_group[names[0]], shared, starts[names[0]])}
    points = [p for g in names for p in by_group[g]]

    def unpack(x: np.ndarray) -> dict[str, Efficiency]:
        tied = x[3 * len(names) :]
        return {g: x_to_eff(np.concatenate([x[3 * i : 3 * i + 3], tied])) for i, g in enumerate(names)}

    def objective(x: np.ndarray) -> float:
        effs = unpack(x)
        pull = sum(float(np.sum((eff_to_x(e) - _PRIOR_X) ** 2)) for e in effs.values()) / len(effs)
        return _loss(points, lambda p: effs[p.group], shared) + PRIOR_WEIGHT * pull

    xs = [eff_to_x(starts[g]) for g in names]
    x = np.concatenate([*(v[_OWN_DIMS] for v in xs), np.mean([v[_TIED_DIMS] for v in xs], axis=0)])
    for step, iters in passes:
        x = nelder_mead(objective, x, step=step, iters=iters)
    return unpack(x)


def _families(points: Sequence[Point]) -> dict[str, dict[str, list[Point]]]:
    """Latency family -> group -> its points, in the points' order."""
    out: dict[str, dict[str, list[Point]]] = {}
    for p in points:
        out.setdefault(p.latency_family, {}).setdefault(p.group, []).append(p)
    return out


def _in_parallel(calls: Sequence[tuple[Callable[..., _T], tuple[Any, ...]]]) -> Iterator[tuple[int, _T]]:
    """(index, result) of each call as it finishes: the fit's refits are independent CPU-bound Python,
    so one process per core runs them; on one core (or for one call) they run here, in order.

    The workers leave Ctrl-C to this process (which stops them: no traceback of theirs) and die with
    it should it be killed outright."""
    workers = min(len(calls), os.cpu_count() or 1)
    if workers <= 1:
        for i, (fn, args) in enumerate(calls):
            yield i, fn(*args)
        return
    pool = multiprocessing.get_context("fork").Pool(
        workers, initializer=_worker_start, initargs=(os.getpid(),)
    )
    try:
        yield from pool.imap_unordered(_indexed_call, list(enumerate(calls)))
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def _worker_start(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_parent_death_signal(signal.SIGTERM, parent)


def _indexed_call(item: tuple[int, tuple[Callable[..., _T], tuple[Any, ...]]]) -> tuple[int, _T]:
    i, (fn, args) = item
    return i, fn(*args)


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
    """Every group's coefficients and the shared ones; ``progress`` gets a line per family fitted (a
    fit takes minutes)."""
    families = _families(points)
    groups = {g: _start_of(g, start) for fam in families.values() for g in fam}
    shared = start.shared if start else DEFAULT_SHARED
    rounds = 1 if shared_fixed else ROUNDS
    for r in range(rounds):
        names = list(families)
        calls = [(fit_family, (families[f], shared, {g: groups[g] for g in families[f]})) for f in names]
        for k, (i, fitted) in enumerate(_in_parallel(calls), 1):
            groups.update(fitted)
            if progress is not None:
                fam = families[names[i]]
                n = sum(len(v) for v in fam.values())
                progress(f"round {r + 1}/{rounds}: family {k}/{len(families)} {' + '.join(fam)} ({n} points)")
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
    """Each point predicted by its group's coefficients refitted without it, with the rest of its
    latency family (shared ones kept). The only point of its group (an older software generation's) is
    predicted by its hardware/precision's current coefficients, the nearest the remaining data come
    to it. The refits run in parallel, one process per core."""
    out: list[tuple[Point, Prediction] | None] = [None] * len(points)
    calls = [(_predict_without, (points, i, full)) for i in range(len(points))]
    for k, (i, pred) in enumerate(_in_parallel(calls), 1):
        out[i] = (points[i], pred)
        if progress is not None:
            progress(f"leave-one-out {k}/{len(points)}: {points[i].group}")
    return [pair for pair in out if pair is not None]


def _predict_without(points: Sequence[Point], i: int, full: FitResult) -> Prediction:
    p = points[i]
    rest = [q for j, q in enumerate(points) if j != i and q.latency_family == p.latency_family]
    if any(q.group == p.group for q in rest):
        fam = _families(rest)[p.latency_family]
        eff = fit_family(fam, full.shared, {g: full.groups[g] for g in fam})[p.group]
    else:
        eff = full.groups.get(p.group.split("@")[0], DEFAULT_EFFICIENCY)
    return predict(p, eff, full.shared)
