"""What an accuracy check asks: the task, how many questions, the threshold a score must reach.

Thresholds and few-shot counts come from one table per task (``TASKS``), with where each number comes
from; an entry may state its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator


@dataclass(frozen=True, slots=True)
class Task:
    """A task the gate knows: the harness's task name, the metric and filter it is judged on, and its
    defaults."""

    harness_task: str
    metric: str
    filter: str
    num_fewshot: int
    threshold: float
    source: str  # where the default threshold and few-shot count come from


TASKS: dict[str, Task] = {
    "gsm8k": Task(
        harness_task="gsm8k",
        metric="exact_match",
        filter="strict-match",
        num_fewshot=5,
        threshold=0.90,
        source="InferenceX utils/evals: GSM8K, 5-shot with the chat template, 0.90 unless a model's floor says otherwise",
    ),
}


class AccuracySpec(BaseModel):
    """One accuracy check. ``limit`` takes a seeded subset of the task's questions (None: all of them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str = "gsm8k"
    limit: Annotated[int, Field(gt=0)] | None = None
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    num_fewshot: Annotated[int, Field(ge=0)] | None = None
    seed: int = 1234
    timeout_s: Annotated[float, Field(gt=0)] = 1800.0

    @field_validator("task")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in TASKS:
            raise ValueError(f"unknown task {value!r}; known: {', '.join(sorted(TASKS))}")
        return value

    @property
    def info(self) -> Task:
        return TASKS[self.task]

    @property
    def effective_threshold(self) -> float:
        return self.info.threshold if self.threshold is None else self.threshold

    @property
    def effective_fewshot(self) -> int:
        return self.info.num_fewshot if self.num_fewshot is None else self.num_fewshot
