"""The steady window: the part of the profiling span whose load is at its plateau.

Rule (docs/metrics.md repeats it): the profiling span (from the end of warmup to the moment
dispatching stopped) is cut into ``STEADY_BINS`` equal bins, and each bin's mean number of requests in
flight (time-weighted, every request of the run counted, warmup included) is measured. The peak is the
largest bin mean. The steady window runs from the start of the first bin whose mean is at least
``STEADY_FRACTION`` of the peak to the end of the last such bin: the ramp-up before the load first
reaches its plateau and the drain after it last leaves it are excluded, while dips in between (think
time, a sub-agent join) belong to the agentic load and stay. Bins are at least ``MIN_BIN_S`` long
(fewer bins in a short span); a span too short for ``MIN_BINS`` of them, or with nothing in flight,
keeps its whole length.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Half the peak: at 75 % the fan-out of sub-agents (a peak well above the lanes) made ordinary think
# time read as a trough and cut healthy runs to a fraction of their span.
STEADY_FRACTION = 0.5
STEADY_BINS = 20
MIN_BIN_S = 0.5
MIN_BINS = 4
RULE = (
    f"from the first to the last of {STEADY_BINS} equal bins (at least {MIN_BIN_S:g} s each) of the "
    f"profiling span whose mean in-flight requests reach {STEADY_FRACTION:.0%} of the peak bin's"
)


@dataclass(frozen=True, slots=True)
class SteadyWindow:
    """Bounds in seconds after the run start."""

    start: float
    stop: float
    span_start: float
    span_stop: float
    peak_in_flight: float
    threshold: float

    @property
    def duration(self) -> float:
        return self.stop - self.start


def in_flight_bins(
    intervals: Iterable[tuple[float, float]], start: float, stop: float, bins: int
) -> list[float]:
    """Time-weighted mean number of ``(dispatch, done)`` intervals open in each of ``bins`` equal bins
    of [start, stop]."""
    width = (stop - start) / bins
    busy = [0.0] * bins
    if width <= 0:
        return busy
    full = [0] * (bins + 1)  # difference array: bins an interval covers whole
    for lo, hi in intervals:
        lo, hi = max(lo, start), min(hi, stop)
        if hi <= lo:
            continue
        first, last = int((lo - start) / width), min(int((hi - start) / width), bins - 1)
        if first == last:
            busy[first] += hi - lo
            continue
        busy[first] += start + (first + 1) * width - lo
        busy[last] += hi - (start + last * width)
        if last > first + 1:
            full[first + 1] += 1
            full[last] -= 1
    running = 0
    for i in range(bins):
        running += full[i]
        busy[i] = busy[i] / width + running
    return busy


def steady_window(
    intervals: Iterable[tuple[float, float]],
    start: float,
    stop: float,
    *,
    fraction: float = STEADY_FRACTION,
    bins: int = STEADY_BINS,
) -> SteadyWindow:
    """The steady window of the span [start, stop] (rule at the top)."""
    bins = min(bins, int((stop - start) / MIN_BIN_S))
    if bins < MIN_BINS:
        return SteadyWindow(start, stop, start, stop, 0.0, 0.0)
    means = in_flight_bins(intervals, start, stop, bins)
    peak = max(means, default=0.0)
    threshold = fraction * peak
    if peak <= 0:
        return SteadyWindow(start, stop, start, stop, 0.0, 0.0)
    inside = [i for i, m in enumerate(means) if m >= threshold]
    width = (stop - start) / bins
    lo = start + inside[0] * width
    hi = stop if inside[-1] == bins - 1 else start + (inside[-1] + 1) * width
    return SteadyWindow(lo, hi, start, stop, peak, threshold)
