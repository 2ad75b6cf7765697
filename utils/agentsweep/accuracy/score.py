"""A score's interval and its verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def wilson_interval(correct: int, total: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``correct`` out of ``total`` (sound near 0 and 1, unlike the normal
    approximation the harness prints as its stderr)."""
    if total <= 0:
        raise ValueError("an interval needs at least one question")
    p = correct / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True, slots=True)
class Score:
    task: str
    correct: int
    total: int
    threshold: float

    @property
    def value(self) -> float:
        return self.correct / self.total

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.correct, self.total)

    @property
    def passed(self) -> bool:
        return self.value >= self.threshold

    def line(self) -> str:
        """``gsm8k 0.41 < 0.90 over 250 questions, 95% CI 0.35-0.47`` (``>=`` when it passes)."""
        low, high = self.interval
        sign = ">=" if self.passed else "<"
        return (
            f"{self.task} {self.value:.2f} {sign} {self.threshold:.2f} over {self.total} questions, "
            f"95% CI {low:.2f}-{high:.2f}"
        )
