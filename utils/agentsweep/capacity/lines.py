"""The one plain line per SLO tier, as the capacity cell's log and the report print it.

``tier interactive (TTFT p90 ≤ 10 s, speed p25 ≥ 20 tok/s): 24 agents per GPU (22–26), bound by TTFT p90``
"""

from __future__ import annotations

from agentsweep.contract.resultdir.capacity import TierResult
from agentsweep.contract.slo import SloTier


def agents(users: float, gpus: int) -> str:
    """Agents per GPU as a line shows them: whole when whole, else one decimal."""
    value = users / gpus
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def _tokens(value: int | None) -> str:
    if value is None:
        return "?"
    return f"{value / 1000:,.0f}k" if value >= 10_000 else f"{value:,}"


def _interval(result: TierResult, gpus: int) -> str:
    if result.interval_users is None:
        return ""
    lo, hi = result.interval_users
    if hi is None:
        return f" ({agents(lo, gpus)} or more)"
    return f" ({agents(lo, gpus)}–{agents(hi, gpus)})"


def _per_mw(result: TierResult) -> str:
    return f", {result.agents_per_mw:,.0f} agents per MW" if result.agents_per_mw else ""


def cliff_text(result: TierResult) -> str:
    """``a cliff: TTFT p90 ×12 from 7 to 8 users (KV working set 150k → 171k tokens, pool 160k)``."""
    cliff = result.cliff
    if cliff is None:
        return ""
    factor = f" ×{cliff.factor:.3g}" if cliff.factor is not None else ""
    text = f"a cliff: {cliff.statistic}{factor} from {cliff.below_users} to {cliff.above_users} users"
    if cliff.kv_working_set_below is not None or cliff.kv_working_set_above is not None:
        pool = cliff.kv_pool_above or cliff.kv_pool_below
        text += (
            f" (KV working set {_tokens(cliff.kv_working_set_below)} → {_tokens(cliff.kv_working_set_above)}"
            f" tokens, GPU pool {_tokens(pool)})"
        )
    return text


def tier_line(tier: SloTier, result: TierResult, gpus: int, binding_text: str | None) -> str:
    """The tier's plain line; ``binding_text`` is the binding statistic's value (or a step's reason)."""
    head = f"tier {tier.describe()}: "
    if result.boundary_type == "none":
        return (
            f"{head}0 agents per GPU: even {result.binding_users} users miss it "
            f"({result.binding} {binding_text})"
        )
    if result.boundary_type == "at_least":
        assert result.boundary_users is not None
        return (
            f"{head}≥ {agents(result.boundary_users, gpus)} agents per GPU{_per_mw(result)} "
            f"(the highest count searched, {result.boundary_users} users, still meets it)"
        )
    if result.boundary_type == "unresolved":
        if result.boundary_users is None:
            return f"{head}not measured ({result.stop_reason})"
        return (
            f"{head}at least {agents(result.boundary_users, gpus)} agents per GPU"
            f"{_interval(result, gpus)}, not bracketed ({result.stop_reason})"
        )
    assert result.boundary_users is not None
    line = (
        f"{head}{agents(result.boundary_users, gpus)} agents per GPU{_interval(result, gpus)}{_per_mw(result)}, "
        f"bound by {result.binding}"
    )
    if result.binding_users is not None and binding_text:
        line += f" ({binding_text} at {result.binding_users} users)"
    cliff = cliff_text(result)
    return f"{line}; {cliff}" if cliff else line
