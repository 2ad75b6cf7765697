"""What a routed cell's instances and router leave behind, combined after the replay.

Every instance behind a router is scraped on its own (``server_metrics.<name>.csv``); after the
replay the rows of the instances that answer the client (the replicas, or the decode instances) are
merged into ``server_metrics.csv``: counters and request counts summed, usage fractions averaged, so
the validity checks that compare client sums with server counters hold as for one engine. The
prefill instances are merged the same way into ``server_metrics.prefill.csv``. The router's own
per-instance request counts go to ``router.json``.
"""

from __future__ import annotations

import urllib.error
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentsweep.cell.plan import CellPlan
from agentsweep.cell.routers import router_recipe, router_version
from agentsweep.cell.settle import SETTLE_INTERVAL_S, SETTLE_TIMEOUT_S, read_metrics, settle
from agentsweep.contract.resultdir import (
    ROUTER_METRICS_TXT,
    ROUTER_METRICS_TXT_MAX_BYTES,
    RouterRecord,
    write_atomic,
    write_router,
)

# The router's figures are taken once they stop moving (``agentsweep.cell.settle``): a router renders
# its counters one at a time, so a read as the replay ends is torn (smg renders its policy's branch
# counter before its per-worker counts, so the read held 32 routing decisions beside 33 requests sent).


@dataclass(frozen=True)
class RouterRead:
    """The router's /metrics text as router.json is made from it, or why there is none."""

    text: str | None
    error: str | None = None
    settled: bool = True  # False: its figures still moved when the settling time ran out


def router_figures(plan: CellPlan, metrics_text: str) -> dict[str, Any]:
    """What router.json says of the router's routing, from its /metrics text.

    Data-parallel: requests per replica and the busiest one's share. Prefill/decode: requests per
    prefill and per decode instance (both routers count each instance under its URL) and the busiest
    share of each role.
    """
    assert plan.router is not None
    program = router_recipe(plan.router.program)
    figures = request_figures(plan, program.requests_by_worker(metrics_text))
    figures.update(program.affinity(metrics_text))
    return figures


def request_figures(plan: CellPlan, by_worker: Mapping[str, float]) -> dict[str, Any]:
    """router.json's requests per instance of each role (``by_worker``: requests by instance URL) and
    the busiest instance's share of its role's."""
    figures: dict[str, Any] = {}
    groups = (
        [("prefill", plan.prefill), ("decode", plan.decode)]
        if plan.mode == "pd"
        else [("replica", plan.instances)]
    )
    for role, members in groups:
        counts = [by_worker.get(r.url, 0.0) for r in members]
        total = sum(counts)
        figures[f"requests_by_{role}"] = counts
        figures[f"busiest_{role}_share"] = max(counts) / total if total else None
    return figures


def router_identity(plan: CellPlan, program: str, version: str | None, policy_flag: str) -> dict[str, Any]:
    """What router.json names: the router program and version, the mode, the cell's policy and the
    program's name for it, and the instances it routed to by role."""
    figures: dict[str, Any] = {
        "program": program,
        "version": version,
        "mode": plan.mode,
        "policy": plan.cell.router,
        "policy_flag": policy_flag,
    }
    if plan.mode == "pd":
        figures["prefill"] = [r.url for r in plan.prefill]
        figures["decode"] = [r.url for r in plan.decode]
    else:
        figures["replicas"] = [r.url for r in plan.instances]
    return figures


def settled_router_metrics(
    plan: CellPlan, timeout_s: float = SETTLE_TIMEOUT_S, interval_s: float = SETTLE_INTERVAL_S
) -> RouterRead:
    """The router's /metrics once two reads ``interval_s`` apart give the same router figures (the
    last read when they still move after ``timeout_s``; ``settled`` says which)."""
    router = plan.router
    assert router is not None
    try:
        text, settled = settle(
            lambda: read_metrics(router.metrics_url),
            lambda text: repr(router_figures(plan, text)),
            timeout_s,
            interval_s,
        )
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        return RouterRead(None, f"cannot read {router.metrics_url}: {err}")
    return RouterRead(text, settled=settled)


def write_router_figures(plan: CellPlan, result_dir: Path, read: RouterRead | None = None) -> None:
    """router.json: the router's requests per instance (and its metrics text, histograms left out),
    from ``read`` (default: a settled read now)."""
    router = plan.router
    assert router is not None
    read = read if read is not None else settled_router_metrics(plan)
    policy_flag = router_recipe(router.program).policy_name(plan.cell.router)
    figures = router_identity(plan, router.program, router_version(router.program), policy_flag)
    text = read.text
    if text is None:
        figures["error"] = read.error or f"cannot read {router.metrics_url}"
    else:
        figures.update(router_figures(plan, text))
        kept = "".join(
            line + "\n"
            for line in text.splitlines()
            if line and "_bucket{" not in line and not line.startswith("#")
        )
        write_atomic(result_dir / ROUTER_METRICS_TXT, kept[:ROUTER_METRICS_TXT_MAX_BYTES])
    write_router(result_dir, RouterRecord.from_figures(figures))
