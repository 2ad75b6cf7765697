"""The capacity search on made-up measurements: which counts it steps to, and what it says per tier."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from agentsweep.capacity.isotonic import monotone, nondecreasing
from agentsweep.capacity.search import next_users, tier_results
from agentsweep.contract.resultdir import CapacityRecord, StepRecord, TierResult
from agentsweep.contract.slo import CapacitySpec, parse_tiers

Measure = Callable[[int, int], tuple[str, dict[str, float | None]]]


def spec(tiers: dict[str, list[str]], low: int = 2, high: int = 64, **options: object) -> CapacitySpec:
    return CapacitySpec(low=low, high=high, time_limit_min=60, tiers=parse_tiers(tiers), **options)


def search(capacity: CapacitySpec, measure: Measure, budget: int = 100) -> list[StepRecord]:
    """Run the search against ``measure(users, repeat) -> (status, statistics)``."""
    steps: list[StepRecord] = []
    while (users := next_users(capacity, steps)) is not None and len(steps) < budget:
        for repeat in range(capacity.repeats):
            status, stats = measure(users, repeat)
            steps.append(
                StepRecord(
                    index=len(steps),
                    users=users,
                    repeat=repeat,
                    dir=f"steps/{len(steps)}",
                    exp_name=f"c-step{len(steps)}-u{users}",
                    status=status,  # type: ignore[arg-type]
                    reasons=() if status == "SUCCESS" else ("failed_share: 9 of 40 requests failed",),
                    statistics=stats,
                    kv_working_set_tokens=users * 50_000,
                    kv_pool_tokens=1_000_000,
                )
            )
    return steps


def by_tier(results: list[TierResult]) -> dict[str, TierResult]:
    return {r.tier: r for r in results}


def smooth_ttft(users: int, _repeat: int) -> tuple[str, dict[str, float | None]]:
    return "SUCCESS", {"ttft:p90": 0.5 * users, "output_speed:p25": 100.0 / users}


def test_brackets_from_the_low_end_then_bisects_to_whole_users() -> None:
    capacity = spec({"t": ["ttft p90 <= 10 s"]})  # boundary 20: 0.5 * 20 = 10
    steps = search(capacity, smooth_ttft)
    assert [s.users for s in steps] == [2, 4, 8, 16, 32, 24, 20, 22, 21]
    reason, results = tier_results(capacity, steps, gpus=1)
    result = results[0]
    assert reason == "converged" and result.stop_reason == "converged"
    assert (result.boundary_users, result.interval_users, result.boundary_type) == (20, (20, 20), "smooth")
    assert result.binding == "TTFT p90" and result.binding_users == 21
    assert result.binding_value == pytest.approx(10.5)
    assert result.line == (
        "tier t (TTFT p90 ≤ 10 s): 20 agents per GPU (20–20), bound by TTFT p90 (10.5 s at 21 users)"
    )


def test_all_tiers_come_from_one_search() -> None:
    one = spec({"loose": ["ttft p90 <= 10 s"], "tight": ["speed p25 >= 10 tok/s"]})
    steps = search(one, smooth_ttft)
    counts = [s.users for s in steps]
    assert len(counts) == len(set(counts)), "no count is measured twice"
    separate = sum(
        len(search(spec({n: c}), smooth_ttft))
        for n, c in {"a": ["ttft p90 <= 10 s"], "b": ["speed p25 >= 10 tok/s"]}.items()
    )
    assert len(steps) < separate  # the bracket is shared
    results = by_tier(tier_results(one, steps, gpus=2)[1])
    assert results["loose"].boundary_users == 20 and results["loose"].agents_per_gpu == 10
    assert results["tight"].boundary_users == 10 and results["tight"].binding == "speed p25"
    assert "5 agents per GPU (5–5)" in results["tight"].line


def test_relative_resolution_stops_at_a_coarser_bracket() -> None:
    capacity = spec({"t": ["ttft p90 <= 10 s"]}, resolution=0.25)
    steps = search(capacity, smooth_ttft)
    result = tier_results(capacity, steps, gpus=1)[1][0]
    assert result.stop_reason == "converged" and result.interval_users is not None
    low, high = result.interval_users
    assert low <= 20 <= high and high + 1 - low <= max(1, math.floor(0.25 * low))
    assert len(steps) < len(search(spec({"t": ["ttft p90 <= 10 s"]}), smooth_ttft))


def test_isotonic_smoothing_reads_through_a_noisy_point() -> None:
    # 8 users reads 8.4 s by noise, 16 users 7.0 s: no engine gets faster with more users. Raw, the
    # tight tier would end below 8; smoothed, 8 and 16 pool to 7.7 s and the tier goes on.
    noisy = {2: 1.0, 4: 2.0, 8: 8.4, 16: 7.0}

    def measure(users: int, _repeat: int) -> tuple[str, dict[str, float | None]]:
        return "SUCCESS", {"ttft:p90": noisy.get(users, users * 0.6)}

    capacity = spec({"tight": ["ttft p90 <= 8 s"], "loose": ["ttft p90 <= 12 s"]}, high=32)
    steps = search(capacity, measure)
    results = by_tier(tier_results(capacity, steps, gpus=1)[1])
    assert [s.users for s in steps][:5] == [2, 4, 8, 16, 32]  # the loose tier's bracket goes first
    tight = results["tight"].boundary_users
    assert tight is not None and tight >= 16
    assert results["loose"].boundary_users == 20  # 0.6 * 20 = 12
    assert nondecreasing([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
    assert monotone([5, 3, 4, 1], increasing=False) == [5, 3.5, 3.5, 1]


def test_an_invalid_step_never_meets_a_tier() -> None:
    def measure(users: int, _repeat: int) -> tuple[str, dict[str, float | None]]:
        # Every statistic is fine, but from 12 users on the runs are not valid.
        return ("INVALID" if users >= 12 else "SUCCESS"), {"ttft:p90": 0.1}

    capacity = spec({"t": ["ttft p90 <= 10 s"]})
    result = tier_results(capacity, search(capacity, measure), gpus=1)[1][0]
    assert result.boundary_users == 11
    assert result.binding == "validity"
    assert "failed_share" in result.line


def test_even_the_lowest_count_failing_is_capacity_zero_with_its_measured_value() -> None:
    capacity = spec({"t": ["ttft p90 <= 0.5 s"]}, low=2)
    steps = search(capacity, smooth_ttft)
    reason, results = tier_results(capacity, steps, gpus=1)
    result = results[0]
    assert [s.users for s in steps] == [2]
    assert reason == "lowest count fails" and result.stop_reason == "lowest count fails"
    assert (result.boundary_users, result.agents_per_gpu, result.boundary_type) == (0, 0.0, "none")
    assert result.binding == "TTFT p90" and result.binding_value == pytest.approx(1.0)
    assert result.line == "tier t (TTFT p90 ≤ 0.5 s): 0 agents per GPU: even 2 users miss it (TTFT p90 1 s)"


def test_the_highest_count_passing_is_at_least_high() -> None:
    capacity = spec({"t": ["ttft p90 <= 1000 s"]}, low=1, high=12)
    steps = search(capacity, smooth_ttft)
    assert [s.users for s in steps] == [1, 2, 4, 8, 12]
    reason, results = tier_results(capacity, steps, gpus=1)
    assert reason == "highest count passes"
    assert (results[0].boundary_users, results[0].boundary_type) == (12, "at_least")
    assert results[0].line.startswith("tier t (TTFT p90 ≤ 1,000 s): ≥ 12 agents per GPU")


def test_a_jump_beyond_the_cliff_factor_is_a_cliff_with_the_kv_working_set() -> None:
    def measure(users: int, _repeat: int) -> tuple[str, dict[str, float | None]]:
        return "SUCCESS", {"ttft:p90": 2.0 if users <= 20 else 40.0}

    capacity = spec({"t": ["ttft p90 <= 10 s"]})
    result = tier_results(capacity, search(capacity, measure), gpus=1)[1][0]
    assert (result.boundary_users, result.boundary_type) == (20, "cliff")
    assert result.cliff is not None
    assert (result.cliff.below_users, result.cliff.above_users, result.cliff.factor) == (20, 21, 20.0)
    assert (result.cliff.kv_working_set_below, result.cliff.kv_working_set_above) == (1_000_000, 1_050_000)
    assert result.cliff.kv_pool_above == 1_000_000
    assert (
        "a cliff: TTFT p90 ×20 from 20 to 21 users (KV working set 1,000k → 1,050k tokens, GPU pool 1,000k)"
        in result.line
    )


def test_a_smooth_rise_is_not_a_cliff() -> None:
    capacity = spec({"t": ["ttft p90 <= 10 s"]}, cliff_factor=1.2)
    result = tier_results(capacity, search(capacity, smooth_ttft), gpus=1)[1][0]
    assert result.boundary_type == "smooth"  # 10.5 / 10 is below 1.2


def test_repeats_give_a_bootstrap_interval_that_holds_the_noise() -> None:
    def measure(users: int, repeat: int) -> tuple[str, dict[str, float | None]]:
        wiggle = (0.85, 1.0, 1.15)[repeat % 3]
        return "SUCCESS", {"ttft:p90": 0.5 * users * wiggle}

    capacity = spec({"t": ["ttft p90 <= 10 s"]}, repeats=3)
    steps = search(capacity, measure)
    assert len(steps) % 3 == 0 and all(
        sum(s.users == u for s in steps) == 3 for u in {s.users for s in steps}
    )
    result = tier_results(capacity, steps, gpus=1)[1][0]
    assert result.interval_kind == "bootstrap" and result.interval_users is not None
    low, high = result.interval_users
    assert high is not None and low < high and low <= 20 <= high
    again = tier_results(capacity, steps, gpus=1)[1][0]
    assert again.interval_users == result.interval_users  # seeded: the same steps, the same interval


def test_a_search_stopped_early_says_why_and_what_it_knows() -> None:
    capacity = spec({"t": ["ttft p90 <= 10 s"]})
    steps = search(capacity, smooth_ttft, budget=5)  # 2, 4, 8, 16, 32: bracketed, not bisected
    reason, results = tier_results(capacity, steps, gpus=1, ended="budget spent")
    assert reason == "budget spent"
    result = results[0]
    assert (result.boundary_type, result.stop_reason, result.boundary_users) == (
        "unresolved",
        "budget spent",
        16,
    )
    assert (
        result.line
        == "tier t (TTFT p90 ≤ 10 s): at least 16 agents per GPU (16–31), not bracketed (budget spent)"
    )
    assert tier_results(capacity, [], gpus=1, ended="interrupted")[1][0].line == (
        "tier t (TTFT p90 ≤ 10 s): not measured (interrupted)"
    )


def test_agents_per_mw_where_a_step_measured_power() -> None:
    capacity = spec({"t": ["ttft p90 <= 10 s"]})
    steps = search(capacity, smooth_ttft)
    result = tier_results(capacity, steps, gpus=1, power_w=lambda users: 700.0)[1][0]
    assert result.agents_per_mw == pytest.approx(20 / 700e-6)
    assert "agents per MW" in result.line
    assert tier_results(capacity, steps, gpus=1)[1][0].agents_per_mw is None


@pytest.mark.parametrize("ended", ["interrupted", "engine failed", "step failed"])
def test_the_step_a_search_was_cut_short_in_is_not_judged(ended: str) -> None:
    capacity = spec({"t": ["ttft p90 <= 10 s"]})
    steps = search(capacity, smooth_ttft, budget=3)  # 2, 4, 8: all meet the tier
    cut = search(capacity, lambda u, r: ("FAILED", {}) if u == 16 else smooth_ttft(u, r), budget=4)
    assert [s.users for s in cut] == [2, 4, 8, 16] and cut[-1].status == "FAILED"
    result = tier_results(capacity, cut, gpus=1, ended=ended)[1][0]  # type: ignore[arg-type]
    assert (result.boundary_users, result.boundary_type, result.stop_reason) == (8, "unresolved", ended)
    assert result.interval_users == (8, None) and result.binding is None
    assert result == tier_results(capacity, steps, gpus=1, ended=ended)[1][0]  # type: ignore[arg-type]
    # A search that went on past a FAILED step counts it as missing the tier, as every FAILED step.
    spent = tier_results(capacity, cut, gpus=1, ended="budget spent")[1][0]
    assert (spent.boundary_users, spent.interval_users, spent.binding) == (8, (8, 15), "validity")


def _cliff(users: int, _repeat: int) -> tuple[str, dict[str, float | None]]:
    return "SUCCESS", {"ttft:p90": 2.0 if users <= 20 else 40.0}


def _invalid_above_11(users: int, _repeat: int) -> tuple[str, dict[str, float | None]]:
    return ("INVALID" if users >= 12 else "SUCCESS"), {"ttft:p90": 0.1}


def _noisy(users: int, repeat: int) -> tuple[str, dict[str, float | None]]:
    return "SUCCESS", {"ttft:p90": 0.5 * users * (0.85, 1.0, 1.15)[repeat % 3]}


@pytest.mark.parametrize(
    ("tiers", "options", "measure"),
    [
        ({"t": ["ttft p90 <= 10 s"], "all": ["ttft p90 <= 1000 s"]}, {}, smooth_ttft),
        ({"t": ["ttft p90 <= 10 s"]}, {}, _cliff),
        ({"t": ["ttft p90 <= 10 s"]}, {}, _invalid_above_11),
        ({"t": ["ttft p90 <= 0.5 s"], "u": ["speed p25 >= 1 tok/s"]}, {}, smooth_ttft),
        ({"t": ["ttft p90 <= 10 s"]}, {"repeats": 3}, _noisy),
        ({"t": ["ttft p90 <= 10 s"]}, {"resolution": 0.25}, smooth_ttft),
    ],
    ids=["smooth and at least", "cliff", "invalid steps", "none and speed", "bootstrap", "resolution"],
)
@pytest.mark.parametrize("gpus", [1, 8])
def test_every_record_the_search_writes_is_one_its_reader_takes(tiers, options, measure, gpus) -> None:
    """capacity.json is rewritten after every step (stopped "interrupted" until the end), cut short
    by a FAILED step, spent: each of those records passes the checks its reader makes."""
    capacity = spec(tiers, **options)
    steps = search(capacity, measure)

    def record(done: list[StepRecord], ended: str | None) -> CapacityRecord:
        reason, results = tier_results(capacity, done, gpus=gpus, ended=ended)  # type: ignore[arg-type]
        return CapacityRecord(
            exp_name="c", gpus=gpus, low=capacity.low, high=capacity.high, resolution=capacity.resolution,
            repeats=capacity.repeats, cliff_factor=capacity.cliff_factor, time_limit_s=3600.0,
            step_budget=40, stop_reason=reason, tiers=tuple(results), steps=tuple(done),
        )  # fmt: skip

    for n in range(len(steps) + 1):
        for ended in ("interrupted", "budget spent"):
            CapacityRecord.model_validate_json(record(steps[:n], ended).to_json())
        failed = steps[n - 1].model_copy(update={"status": "FAILED", "reasons": ("died",)}) if n else None
        if failed is not None:
            for ended in ("interrupted", "engine failed", "step failed"):
                CapacityRecord.model_validate_json(record([*steps[: n - 1], failed], ended).to_json())
    final = record(steps, None)
    assert final.stop_reason in ("converged", "lowest count fails", "highest count passes")
    assert CapacityRecord.model_validate_json(final.to_json()) == final
