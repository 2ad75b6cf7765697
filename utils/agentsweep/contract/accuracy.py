"""What the accuracy gate asks of a cell's engine (a config entry's ``accuracy:`` block; docs/accuracy.md).

The task, how many questions, the threshold a score must reach, and whether the gate runs at all:
``auto`` (the default) scores every real engine and says a simulated one's accuracy was not measured
(it answers with filler text, so there is nothing to score); ``on`` forces it, even on the simulated
engine; ``off`` skips it. Thresholds resolve most specific first: the entry's own, the model's
(``MODEL_THRESHOLDS`` by its InferenceX key), the task's (``TASKS``); each table row says where its
number comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GateRun = Literal["auto", "on", "off"]
# Questions a cell's gate asks unless its entry says otherwise: a seeded subset, as InferenceX-style
# checks run GSM8K (a 95% interval of about +-0.035 around 0.90, a fifth of the full set's time).
DEFAULT_LIMIT = 250
DEFAULT_SEED = 1234
# The step's own budget; a cell's allocation keeps this much time for it (cell.allocation), so it is
# about five times what 250 questions take at the estimate below.
DEFAULT_TIMEOUT_S = 600.0
# The figure used for a dry run's time estimate: seconds per question at the harness's 8 in flight
# on a served model of a few hundred output tokens per answer (measure yours: accuracy.json's seconds).
ESTIMATE_S_PER_QUESTION = 0.5
NOT_MEASURED = "accuracy not measured (simulated engine)"


@dataclass(frozen=True, slots=True)
class Task:
    """A task the gate knows: the harness's task name, the metric and filter it is judged on, and its
    defaults."""

    harness_task: str
    dataset: str  # its Hugging Face dataset (what the harness reads from the cache)
    metric: str
    filter: str
    num_fewshot: int
    threshold: float
    source: str  # where the default threshold and few-shot count come from


TASKS: dict[str, Task] = {
    "gsm8k": Task(
        harness_task="gsm8k",
        dataset="openai/gsm8k",
        metric="exact_match",
        filter="strict-match",
        num_fewshot=5,
        threshold=0.90,
        source="InferenceX utils/evals/thresholds.yaml default.gsm8k (5-shot, chat template)",
    ),
}

# A model's own floor by its InferenceX key (contract.model_keys), per task: InferenceX's
# utils/evals/thresholds.yaml ``models`` section.
MODEL_THRESHOLDS: dict[str, dict[str, float]] = {
    "dsr1": {"gsm8k": 0.91},
    "dsv4": {"gsm8k": 0.91},
    "glm5": {"gsm8k": 0.94},
    "glm5.1": {"gsm8k": 0.93},
    "gptoss": {"gsm8k": 0.91},
    "kimik2.5": {"gsm8k": 0.90},
    "minimaxm2.5": {"gsm8k": 0.92},
    "qwen3.5": {"gsm8k": 0.94},
}
MODEL_THRESHOLDS_SOURCE = "InferenceX utils/evals/thresholds.yaml models"


class AccuracySpec(BaseModel):
    """One accuracy check. ``limit`` takes a seeded subset of the task's questions (None: all of them);
    ``data`` is a directory of local ``train.jsonl``/``test.jsonl`` ("" : the Hugging Face cache)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    run: GateRun = "auto"
    task: str = "gsm8k"
    limit: Annotated[int, Field(gt=0)] | None = DEFAULT_LIMIT
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    num_fewshot: Annotated[int, Field(ge=0)] | None = None
    seed: Annotated[int, Field(ge=0)] = DEFAULT_SEED
    timeout_s: Annotated[float, Field(gt=0)] = DEFAULT_TIMEOUT_S
    data: str = ""

    @model_validator(mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        """``accuracy: off`` / ``on`` (YAML reads them as false / true) stand for ``run: off`` / ``on``."""
        if isinstance(value, bool):
            return {"run": "on" if value else "off"}
        if isinstance(value, str):
            return {"run": value}
        return value

    @field_validator("task")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in TASKS:
            raise ValueError(f"unknown task {value!r}; known: {', '.join(sorted(TASKS))}")
        return value

    @property
    def info(self) -> Task:
        return TASKS[self.task]

    def threshold_for(self, model_key: str | None) -> tuple[float, str]:
        """The score to reach and where it comes from: the entry's, the model's, the task's."""
        if self.threshold is not None:
            return self.threshold, "the config entry"
        own = MODEL_THRESHOLDS.get(model_key or "", {}).get(self.task)
        if own is not None:
            return own, f"{MODEL_THRESHOLDS_SOURCE}.{model_key}"
        return self.info.threshold, self.info.source

    @property
    def effective_fewshot(self) -> int:
        return self.info.num_fewshot if self.num_fewshot is None else self.num_fewshot

    def applies(self, simulated: bool) -> bool:
        """Whether a cell runs the gate: ``on``, or ``auto`` on a real engine."""
        return self.run == "on" or (self.run == "auto" and not simulated)

    def reserved_s(self, simulated: bool) -> float:
        """The time a cell's allocation keeps for the step: its budget when it runs, else none."""
        return self.timeout_s if self.applies(simulated) else 0.0

    def estimate_s(self) -> float:
        """A rough time for the step (the dry run's figure), capped by its budget; every question of
        GSM8K's test split (1,319) without a limit."""
        return min(self.timeout_s, (self.limit or 1319) * ESTIMATE_S_PER_QUESTION)
