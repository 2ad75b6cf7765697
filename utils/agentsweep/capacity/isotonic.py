"""Isotonic (monotone) regression by pool-adjacent-violators: smooth a statistic over user counts.

More users never make a latency better, nor a per-request speed faster, on one engine: a measured
curve that says otherwise is noise. The search reads each constraint's boundary off the closest
monotone curve (least squares, weighted by the samples at each count) instead of the raw points.
"""

from __future__ import annotations

from collections.abc import Sequence


def nondecreasing(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (same length)."""
    if weights is None:
        weights = [1.0] * len(values)
    if len(weights) != len(values):
        raise ValueError("values and weights differ in length")
    # Blocks of pooled neighbours: (mean, weight, how many values).
    blocks: list[list[float]] = []
    for value, weight in zip(values, weights, strict=True):
        blocks.append([float(value), float(weight), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean2, w2, n2 = blocks.pop()
            mean1, w1, n1 = blocks[-1]
            total = w1 + w2
            blocks[-1] = [(mean1 * w1 + mean2 * w2) / total if total else (mean1 + mean2) / 2, total, n1 + n2]
    out: list[float] = []
    for mean, _weight, count in blocks:
        out.extend([mean] * int(count))
    return out


def monotone(
    values: Sequence[float], weights: Sequence[float] | None = None, *, increasing: bool
) -> list[float]:
    """The closest non-decreasing (``increasing``) or non-increasing sequence to ``values``."""
    if increasing:
        return nondecreasing(values, weights)
    return [-v for v in nondecreasing([-v for v in values], weights)]
