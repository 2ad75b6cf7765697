"""Figures of a routed (scale-out) cell: router.json and the engine instances' own metrics.

A routed cell (docs/scaleout.md) runs engine instances behind a router: replicas ``r<i>``, or for a
disaggregated cell prefill instances ``p<i>`` and decode instances ``d<i>``. Each instance is scraped
into ``server_metrics.<name>.csv``; ``server_metrics.csv`` merges the client-facing ones (every
replica; the decode instances of a disaggregated cell) and ``server_metrics.prefill.csv`` the prefill
instances. ``router.json`` holds the router's per-instance request counts and, where the router
exposes them, its affinity figures.

What is missing gives an empty figure and a note naming the file (as a missing server_metrics.csv
does); what is there but breaks its format, or contradicts the cell, is a problem that makes the row
INVALID with a ``collect:`` reason (as unreadable numbers in server_metrics.csv do).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kv_cache_tester.inputfiles import InputFileProblem, read_limited

from agentsweep.collect.window import NotNumbers, window_figures

ROUTER_JSON = "router.json"
MAX_ROUTER_JSON_BYTES = 4 << 20
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


def _role(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, Mapping) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def role_shape(value: Any) -> tuple[int, int] | None:
    """(replicas, tp) of a prefill or decode role, from the cell's object or its JSON text."""
    role = _role(value)
    if role is None:
        return None
    replicas, tp = _count(role.get("replicas", 1)), _count(role.get("tp"))
    return (replicas, tp) if replicas and tp else None


def shape_label(prefill: Any, decode: Any) -> str:
    """``p<replicas>x<tp>-d<replicas>x<tp>`` for a disaggregated cell, empty otherwise."""
    p, d = role_shape(prefill), role_shape(decode)
    if p is None or d is None:
        return ""
    return f"p{p[0]}x{p[1]}-d{d[0]}x{d[1]}"


def instance_names(cell: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(client-facing instances, prefill instances) of a routed cell, as named in its files."""
    p, d = role_shape(cell.get("prefill")), role_shape(cell.get("decode"))
    if p is not None and d is not None:
        return [f"d{i}" for i in range(d[0])], [f"p{i}" for i in range(p[0])]
    replicas = _count(cell.get("replicas")) or 1
    return [f"r{i}" for i in range(replicas)], []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _fraction(data: Mapping[str, Any], key: str, out: Routed) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    number = _number(value)
    if number is None or not 0.0 <= number <= 1.0:
        out.problems.append(f"{ROUTER_JSON}: {key} must be a fraction 0..1, got {str(value)[:40]!r}")
        return None
    return number


def _counts(data: Mapping[str, Any], key: str, expected: int, out: Routed) -> list[float] | None:
    value = data.get(key)
    if value is None:
        return None
    numbers = [_number(v) for v in value] if isinstance(value, list) else [None]
    if not numbers or any(n is None or n < 0 for n in numbers):
        out.problems.append(f"{ROUTER_JSON}: {key} must be a list of request counts, got {str(value)[:60]!r}")
        return None
    if len(numbers) != expected:
        out.problems.append(f"{ROUTER_JSON}: {key} has {len(numbers)} entries for {expected} instances")
        return None
    return [float(n) for n in numbers if n is not None]


def _share(counts: list[float]) -> float | None:
    total = sum(counts)
    return max(counts) / total if total else None


def router_figures(path: Path, cell: Mapping[str, Any], out: Routed) -> None:
    """router_busiest_share, router_prefix_match and router_affinity_share from router.json."""
    file = path / ROUTER_JSON
    if not file.exists() and not file.is_symlink():
        out.notes.append(f"{ROUTER_JSON} missing: no router figures")
        return
    try:
        data = json.loads(read_limited(file, MAX_ROUTER_JSON_BYTES).decode("utf-8"))
    except InputFileProblem as err:
        out.problems.append(f"{ROUTER_JSON}: {err}")
        return
    except (OSError, UnicodeDecodeError) as err:
        out.problems.append(f"{ROUTER_JSON}: unreadable ({err})")
        return
    except ValueError as err:
        out.problems.append(f"{ROUTER_JSON}: not JSON ({err})")
        return
    if not isinstance(data, dict):
        out.problems.append(f"{ROUTER_JSON}: expected an object, got {type(data).__name__}")
        return
    policy = data.get("policy")
    if policy is not None and policy != cell.get("router"):
        out.problems.append(
            f"{ROUTER_JSON}: policy {str(policy)[:40]!r} but the cell's router is {cell.get('router')!r}"
        )
    disaggregated = bool(shape_label(cell.get("prefill"), cell.get("decode")))
    if (data.get("mode") == "pd") != disaggregated:
        cell_kind = "disaggregated" if disaggregated else "not disaggregated"
        out.problems.append(f"{ROUTER_JSON}: mode {data.get('mode')!r} but the cell is {cell_kind}")
        return
    if isinstance(data.get("error"), str):
        out.notes.append(f"{ROUTER_JSON}: no router figures: {data['error'][:200]}")

    main, prefill = instance_names(cell)
    if disaggregated:
        lists = [("requests_by_prefill", len(prefill)), ("requests_by_decode", len(main))]
    else:
        lists = [("requests_by_replica", len(main))]
    # In a disaggregated cell a role of one instance takes all its requests: the share says nothing
    # about balance there, so the other role's decides (both of one instance: 1).
    shares: dict[int, float] = {}
    for key, expected in lists:
        counts = _counts(data, key, expected, out)
        share = _share(counts) if counts is not None else None
        if share is not None:
            shares[expected] = max(share, shares.get(expected, 0.0))
    spread = [share for n, share in shares.items() if n > 1]
    busiest = max(spread or shares.values()) if shares else None
    if not disaggregated:
        given = _fraction(data, "busiest_replica_share", out)
        if given is not None and busiest is not None and abs(given - busiest) > 1e-9:
            out.problems.append(
                f"{ROUTER_JSON}: busiest_replica_share {given:g} but requests_by_replica gives {busiest:g}"
            )
        busiest = busiest if busiest is not None else given
    out.figures["router_busiest_share"] = busiest
    out.figures["router_prefix_match"] = _fraction(data, "mean_prefix_match_ratio", out)

    branches = data.get("policy_branches")
    if branches is None:
        return
    values = {k: _number(v) for k, v in branches.items()} if isinstance(branches, dict) else {"": None}
    if any(v is None or v < 0 for v in values.values()):
        out.problems.append(
            f"{ROUTER_JSON}: policy_branches must map branch names to counts, got {str(branches)[:60]!r}"
        )
        return
    total = sum(v for v in values.values() if v is not None)
    affinity = sum(v for k, v in values.items() if k in AFFINITY_BRANCHES and v is not None)
    out.figures["router_affinity_share"] = affinity / total if total else None


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
    except OSError as err:
        out.problems.append(f"{file.name}: unreadable ({err.strerror or err})")
        return False, None
    out.notes.extend(notes)
    return True, figures["gpu_hit_rate"]


def instance_figures(path: Path, cell: Mapping[str, Any], start: float, end: float, out: Routed) -> None:
    """The spread of the client-facing instances' GPU hit rates, and the prefill instances' rate.

    Each instance's rate is Δhits / Δqueries over the window, as the cell's gpu_hit_rate; an
    instance that got no prefix-cache queries in the window has none and is left out (with a note).
    When any instance's file is missing or unreadable the spread stays empty rather than cover some.
    """
    main, prefill = instance_names(cell)
    rates: list[float] = []
    complete = True
    for name in main:
        readable, rate = _hit_rate(path / f"server_metrics.{name}.csv", start, end, out)
        complete = complete and readable
        if readable and rate is None:
            out.notes.append(f"server_metrics.{name}.csv: no prefix-cache queries in the window")
        elif rate is not None:
            rates.append(rate)
    if complete and rates:
        out.figures["replica_gpu_hit_min"] = min(rates)
        out.figures["replica_gpu_hit_max"] = max(rates)
    elif not complete:
        out.notes.append("per-instance GPU hit rates left empty: an instance's metrics are missing")
    if prefill:
        _, rate = _hit_rate(path / "server_metrics.prefill.csv", start, end, out)
        out.figures["prefill_gpu_hit_rate"] = rate


def routed_figures(path: Path, cell: Mapping[str, Any], start: float, end: float) -> Routed:
    """Every ROUTED column of a routed cell; never raises for bad content."""
    out = Routed()
    router_figures(path, cell, out)
    instance_figures(path, cell, start, end, out)
    return out
