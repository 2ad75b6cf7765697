"""The steady window's rule and the stability block, on hand-made request timelines."""

from __future__ import annotations

import pytest
from kv_cache_tester.replay.stability import stability_block, subwindow_length
from kv_cache_tester.replay.steady import in_flight_bins, steady_window


def _lanes(starts: list[float], ends: list[float], step: float = 0.5) -> list[tuple[float, float]]:
    """Back-to-back requests of ``step`` seconds per lane, from its start to its end."""
    out = []
    for lo, hi in zip(starts, ends, strict=True):
        t = lo
        while t < hi - 1e-9:
            out.append((t, min(t + step, hi)))
            t += step
    return out


def test_in_flight_is_time_weighted_per_bin() -> None:
    assert in_flight_bins([(0.0, 2.0), (1.0, 1.5)], 0.0, 4.0, 4) == pytest.approx([1.0, 1.5, 0.0, 0.0])
    assert in_flight_bins([(0.5, 3.5)], 0.0, 4.0, 4) == pytest.approx([0.5, 1.0, 1.0, 0.5])


def test_a_staggered_ramp_up_is_left_out() -> None:
    # Four lanes join 3 s apart: the load reaches 2 of its 4 lanes (half the peak) at 3 s.
    window = steady_window(_lanes([0.0, 3.0, 6.0, 9.0], [20.0] * 4), 0.0, 20.0)
    assert (window.start, window.stop) == pytest.approx((3.0, 20.0))
    assert window.peak_in_flight == pytest.approx(4.0) and window.threshold == pytest.approx(2.0)


def test_the_drain_is_left_out() -> None:
    window = steady_window(_lanes([0.0] * 4, [20.0, 12.0, 11.0, 10.0]), 0.0, 20.0)
    assert (window.start, window.stop) == pytest.approx((0.0, 12.0))


def test_a_dip_inside_the_plateau_stays_in_the_window() -> None:
    # Two of four lanes think between 8 s and 10 s: down to half the peak, then back.
    lanes = (
        _lanes([0.0, 0.0], [20.0, 20.0]) + _lanes([0.0, 0.0], [8.0, 8.0]) + _lanes([10.0, 10.0], [20.0, 20.0])
    )
    window = steady_window(lanes, 0.0, 20.0)
    assert (window.start, window.stop) == pytest.approx((0.0, 20.0))
    assert min(in_flight_bins(lanes, 0.0, 20.0, 20)) == pytest.approx(2.0)


@pytest.mark.parametrize(("intervals", "stop"), [([(0.0, 1.0)], 1.5), ([], 30.0)], ids=["short", "idle"])
def test_a_short_or_idle_span_keeps_its_whole_length(intervals, stop) -> None:
    window = steady_window(intervals, 0.0, stop)
    assert (window.start, window.stop) == (0.0, stop)


def _record(trace: str, done: float, ttft: float, e2e: float, out: int = 11, salt: str = "") -> dict:
    return {
        "trace_id": trace,
        "salt": salt,
        "t_done": done,
        "ttft_s": ttft,
        "e2e_s": e2e,
        "output_tokens": out,
    }


def test_the_stability_block_by_hand() -> None:
    assert subwindow_length(3000.0) == 600.0 and subwindow_length(30.0) == 10.0
    # Three 10 s sub-windows of a 30 s window; the last one holds no request.
    records = [
        _record("a", 1.0, 0.1, 1.1),  # ITL 0.1
        _record("a", 2.0, 0.3, 0.8),  # ITL 0.05
        _record("b", 12.0, 0.2, 2.2),  # ITL 0.2
        _record("a", 15.0, 0.4, 1.4, salt="x"),  # ITL 0.1, a second play of a: another trajectory
    ]
    block = stability_block(records, 0.0, 30.0)  # type: ignore[arg-type]
    assert block["expected_window_count"] == 3 and block["observed_window_count"] == 2
    # p90 TTFT: window 1 {0.1, 0.3} -> 0.28; window 2 {0.2, 0.4} -> 0.38.
    assert block["observed_window_p90_ttft_min"] == pytest.approx(0.28)
    assert block["observed_window_p90_ttft_max"] == pytest.approx(0.38)
    # Interactivity at p90: 1 / p90 ITL; window 1 {0.05, 0.1} -> 1/0.095, window 2 {0.1, 0.2} -> 1/0.19.
    assert block["observed_window_p90_intvty_min"] == pytest.approx(1 / 0.19)
    assert block["observed_window_p90_intvty_max"] == pytest.approx(1 / 0.095)
    # Trajectories a (2 requests), b (1), a+x (1): Kish (4^2) / (4 + 1 + 1), largest share 2/4.
    assert block["root_trajectory_count"] == 3
    assert block["root_trajectory_kish_effective_count"] == pytest.approx(16 / 6)
    assert block["root_trajectory_largest_share"] == pytest.approx(0.5)


def test_an_empty_window_has_an_empty_block() -> None:
    block = stability_block([], 0.0, 0.0)
    assert block["expected_window_count"] == 0 and block["observed_window_count"] == 0
    assert block["root_trajectory_kish_effective_count"] is None
    assert block["observed_window_p75_e2el_max"] is None
