"""Figures of a routed (scale-out) cell: router.json and the engine instances' own metrics.

A routed cell (docs/scaleout.md) runs engine instances behind a router: replicas ``r<i>``, or for a
disaggregated cell prefill instances ``p<i>`` and decode instances ``d<i>``. Each instance is scraped
into ``server_metrics.<name>.csv``; ``server_metrics.csv`` merges the client-facing ones (every
replica; the decode instances of a disaggregated cell) and ``server_metrics.prefill.csv`` the prefill
instances. ``router.json`` holds the router's per-instance request counts and, where the router
exposes them, its affinity figures; it is read once, with the rest of the cell
(``CellResult.router``, or ``router_error`` when it breaks its contract).

What is missing gives an empty figure and a note naming the file (as a missing server_metrics.csv
does); what is there but breaks its format, or contradicts the cell, is a problem that makes the row
INVALID with a ``collect:`` reason (as unreadable numbers in server_metrics.csv do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kv_cache_tester.metrics import finite

from agentsweep.collect.window import NotNumbers, window_figures
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import (
    PREFILL_METRICS_CSV,
    ROUTER_JSON,
    RouterRecord,
    instance_metrics_csv,
)

# Branches by which a router placed a request where its context already was: smg cache_aware's
# prefix-tree match and consistent_hashing's session-key hit. Every other branch (expected-wait,
# first-healthy, random or min-load fallbacks) placed it by load or chance.
AFFINITY_BRANCHES = frozenset({"tree_match", "routing_key_hit"})


@dataclass
class Routed:
    """The ROUTED columns of one cell, with notes (warnings) and problems (reasons for INVALID)."""

    figures: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def instance_names(cell: Cell) -> tuple[list[str], list[str]]:
    """(client-facing instances, prefill instances) of a routed cell, as named in its files."""
    if cell.prefill is not None and cell.decode is not None:
        return [f"d{i}" for i in range(cell.decode.replicas)], [f"p{i}" for i in range(cell.prefill.replicas)]
    return [f"r{i}" for i in range(cell.replicas)], []


def _counts(
    counts: tuple[float, ...] | None, key: str, expected: int, out: Routed
) -> tuple[float, ...] | None:
    if counts is not None and len(counts) != expected:
        out.problems.append(f"{ROUTER_JSON}: {key} has {len(counts)} entries for {expected} instances")
        return None
    return counts


def _share(counts: tuple[float, ...]) -> float | None:
    total = sum(counts)
    return max(counts) / total if total else None


def router_figures(data: RouterRecord | None, error: str | None, cell: Cell, out: Routed) -> None:
    """router_busiest_share, router_prefix_match and router_affinity_share from router.json as the
    cell's result holds it (``error``: why it breaks its contract; both None without one)."""
    if error is not None:
        out.problems.append(error)
        return
    if data is None:
        out.notes.append(f"{ROUTER_JSON} missing: no router figures")
        return
    if data.policy is not None and data.policy != cell.router:
        out.problems.append(
            f"{ROUTER_JSON}: policy {data.policy[:40]!r} but the cell's router is {cell.router!r}"
        )
    if (data.mode == "pd") != cell.disaggregated:
        cell_kind = "disaggregated" if cell.disaggregated else "not disaggregated"
        out.problems.append(f"{ROUTER_JSON}: mode {data.mode!r} but the cell is {cell_kind}")
        return
    if data.error is not None:
        out.notes.append(f"{ROUTER_JSON}: no router figures: {data.error[:200]}")
    else:  # a router always counts its requests per instance; a record without them is no router's
        absent = [key for key, counts in data.counts_of(cell.disaggregated).items() if counts is None]
        if absent:
            out.problems.append(f"{ROUTER_JSON}: no {' or '.join(absent)} and no error saying why")
            return
    out.figures["router_busiest_share"] = _busiest(data, cell, out)
    out.figures["router_prefix_match"] = data.mean_prefix_match_ratio
    if data.policy_branches is not None:
        total = sum(data.policy_branches.values())
        affinity = sum(v for k, v in data.policy_branches.items() if k in AFFINITY_BRANCHES)
        out.figures["router_affinity_share"] = affinity / total if total else None


def _busiest(data: RouterRecord, cell: Cell, out: Routed) -> float | None:
    """The busiest instance's share of the requests (in a disaggregated cell, of the role with more
    than one instance)."""
    main, prefill = instance_names(cell)
    if cell.disaggregated:
        lists = [
            (data.requests_by_prefill, "requests_by_prefill", len(prefill)),
            (data.requests_by_decode, "requests_by_decode", len(main)),
        ]
    else:
        lists = [(data.requests_by_replica, "requests_by_replica", len(main))]
    # In a disaggregated cell a role of one instance takes all its requests: the share says nothing
    # about balance there, so the other role's decides (both of one instance: 1).
    shares: dict[int, float] = {}
    for given, key, expected in lists:
        counts = _counts(given, key, expected, out)
        share = _share(counts) if counts is not None else None
        if share is not None:
            shares[expected] = max(share, shares.get(expected, 0.0))
    spread = [share for n, share in shares.items() if n > 1]
    busiest = max(spread or shares.values()) if shares else None
    if cell.disaggregated:
        return busiest
    given_share = data.busiest_replica_share
    if given_share is not None and busiest is not None and abs(given_share - busiest) > 1e-9:
        out.problems.append(
            f"{ROUTER_JSON}: busiest_replica_share {given_share:g} but requests_by_replica gives {busiest:g}"
        )
    return busiest if busiest is not None else given_share


def _hit_rate(file: Path, start: float, end: float, out: Routed) -> tuple[bool, float | None]:
    """(readable, GPU hit rate over the window) of one metrics CSV; a missing file is not readable."""
    if not file.is_file():
        out.notes.append(f"{file.name} missing")
        return False, None
    try:
        figures, notes = window_figures(file, start, end)
    except NotNumbers as err:
        out.problems.append(str(err))
        return False, None
    out.notes.extend(notes)
    return True, finite(figures["gpu_hit_rate"])


def instance_figures(path: Path, cell: Cell, start: float, end: float, out: Routed) -> None:
    """The spread of the client-facing instances' GPU hit rates, and the prefill instances' rate.

    Each instance's rate is Δhits / Δqueries over the window, as the cell's gpu_hit_rate; an
    instance that got no prefix-cache queries in the window has none and is left out (with a note).
    When any instance's file is missing or unreadable the spread stays empty rather than cover some.
    """
    main, prefill = instance_names(cell)
    rates: list[float] = []
    complete = True
    for name in main:
        file = instance_metrics_csv(name)
        readable, rate = _hit_rate(path / file, start, end, out)
        complete = complete and readable
        if readable and rate is None:
            out.notes.append(f"{file}: no prefix-cache queries in the window")
        elif rate is not None:
            rates.append(rate)
    if complete and rates:
        out.figures["replica_gpu_hit_min"] = min(rates)
        out.figures["replica_gpu_hit_max"] = max(rates)
    elif not complete:
        out.notes.append("per-instance GPU hit rates left empty: an instance's metrics are missing")
    if prefill:
        _, rate = _hit_rate(path / PREFILL_METRICS_CSV, start, end, out)
        out.figures["prefill_gpu_hit_rate"] = rate


def routed_figures(
    path: Path, cell: Cell, start: float, end: float, router: RouterRecord | None, router_error: str | None
) -> Routed:
    """Every ROUTED column of a routed cell (``router``, ``router_error``: its router.json as
    ``CellResult`` holds it); never raises for bad content."""
    out = Routed()
    router_figures(router, router_error, cell, out)
    instance_figures(path, cell, start, end, out)
    return out
