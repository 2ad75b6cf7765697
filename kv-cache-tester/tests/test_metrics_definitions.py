"""The one definition of the per-request figures (kv_cache_tester.metrics)."""

import math

import pytest
from kv_cache_tester.metrics import (
    full_response_itl_s,
    interactivity_at,
    output_speed_tok_s,
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
