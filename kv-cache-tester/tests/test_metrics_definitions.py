"""The one definition of the per-request figures (kv_cache_tester.metrics)."""

import math

import pytest
from kv_cache_tester.metrics import (
    e2e_norm_interactivity_stats,
    e2e_per_output_token_s,
    full_response_itl_s,
    interactivity_at,
    output_speed_tok_s,
    record_e2e_per_output_token_s,
    record_full_response_itl_s,
    record_output_speed_tok_s,
)


def test_full_response_itl_spreads_the_time_after_the_first_token_over_the_later_tokens() -> None:
    assert full_response_itl_s(2.5, 0.5, 101) == pytest.approx(0.02)
    assert output_speed_tok_s(2.5, 0.5, 101) == pytest.approx(50.0)
    record = {"e2e_s": 2.5, "ttft_s": 0.5, "output_tokens": 101}
    assert record_full_response_itl_s(record) == pytest.approx(0.02)
    assert record_output_speed_tok_s(record) == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("e2e", "ttft", "out"),
    [
        (1.0, 0.5, 1),
        (1.0, 0.5, 0),
        (None, 0.5, 10),
        (1.0, None, 10),
        (0.4, 0.5, 10),
        (math.nan, 0.1, 5),
        (1.0, 0.5, True),
    ],
)
def test_a_request_without_two_tokens_or_a_time_has_no_itl(e2e, ttft, out) -> None:
    assert full_response_itl_s(e2e, ttft, out) is None
    assert output_speed_tok_s(e2e, ttft, out) is None


def test_every_token_at_once_has_an_itl_of_zero_and_no_speed() -> None:
    assert full_response_itl_s(1.0, 1.0, 5) == 0.0
    assert output_speed_tok_s(1.0, 1.0, 5) is None


def test_interactivity_is_the_inverse_of_the_itl_percentile_the_slow_tail() -> None:
    itls = [0.01] * 9 + [0.1]  # nine fast requests, one slow one
    assert interactivity_at(itls, 50) == pytest.approx(100.0)
    p90 = interactivity_at(itls, 90)
    assert p90 is not None and p90 < 100.0  # the slow request pulls p90 interactivity down
    speeds = sorted(1 / x for x in itls)
    wrong_way = speeds[int(0.9 * (len(speeds) - 1))]  # the p90 of per-request speeds: the fast tail
    assert wrong_way == pytest.approx(100.0) and p90 < wrong_way
    assert interactivity_at([], 90) is None


def test_e2e_normalised_interactivity_is_one_over_the_percentile_of_e2e_per_output_token() -> None:
    # InferenceX's MODELS.md: r_i = E2EL_i / OSL_i, and at percentile q, 1 / percentile_q(r).
    assert e2e_per_output_token_s(10.0, 200) == pytest.approx(0.05)
    assert record_e2e_per_output_token_s({"e2e_s": 3.0, "output_tokens": 60}) == pytest.approx(0.05)
    for e2e, out in ((None, 10), (1.0, 0), (0.0, 10), (1.0, None), (math.inf, 5)):
        assert e2e_per_output_token_s(e2e, out) is None
    # Nine quick requests (0.02 s per token) and one that waited 10 s for its first token.
    per_token = [0.02] * 9 + [(10.0 + 0.02 * 100) / 100]
    stats = e2e_norm_interactivity_stats(per_token)
    ordered = sorted(per_token)
    p90 = ordered[8] + 0.1 * (ordered[9] - ordered[8])  # linear between closest ranks
    assert stats["p90"] == pytest.approx(1 / p90) and stats["p90"] < 50.0  # the slow tail
    assert stats["p50"] == pytest.approx(50.0)
    assert stats["mean"] == pytest.approx(1 / (sum(per_token) / 10))
    rates = [1 / v for v in per_token]
    mean_rate = sum(rates) / 10
    assert stats["std"] == pytest.approx(math.sqrt(sum((r - mean_rate) ** 2 for r in rates) / 10))
