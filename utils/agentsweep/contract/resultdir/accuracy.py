"""accuracy.json: the accuracy gate's outcome for the cell's engine (docs/accuracy.md).

Written once, after the engine is healthy and before the replay, by a cell whose gate runs: the score
and its interval against the threshold (``passed`` or ``failed``), or why the step could not run
(``error``). A cell whose gate does not run has none. ``accuracy.jsonl`` beside it keeps every scored
question for audit (written by the harness's reader, ``agentsweep.accuracy.harness``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, cast

from kv_cache_tester.replay.results import Accuracy
from pydantic import BaseModel, ConfigDict, Field

from agentsweep.contract.resultdir.fileio import read_model, write_atomic
from agentsweep.contract.resultdir.files import ACCURACY_JSON

Outcome = Literal["passed", "failed", "error"]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Text = Annotated[str, Field(max_length=4096)]


class AccuracyRecord(BaseModel):
    """accuracy.json. A scored outcome carries every figure; an ``error`` carries its reason."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    outcome: Outcome
    task: Annotated[str, Field(max_length=200)]
    reason: Text  # the line the verdict quotes: "gsm8k 0.41 < 0.90 over 250 questions, 95% CI ..."
    threshold: Fraction
    threshold_source: Text = ""
    harness: Annotated[str, Field(max_length=200)] = ""
    metric: Annotated[str, Field(max_length=200)] = ""
    num_fewshot: Annotated[int, Field(ge=0)] | None = None
    limit: Annotated[int, Field(gt=0)] | None = None
    seed: int | None = None
    doc_ids: list[Annotated[int, Field(ge=0)]] | None = None  # the seeded subset asked; None: all
    questions: Annotated[int, Field(ge=0)] | None = None
    correct: Annotated[int, Field(ge=0)] | None = None
    score: Fraction | None = None
    ci95: tuple[Fraction, Fraction] | None = None
    seconds: Annotated[float, Field(ge=0)] | None = None

    def summary_block(self) -> Accuracy:
        """What summary.json's ``accuracy`` holds: the record with its interval's ends by name (the
        subset's indices stay in accuracy.json)."""
        block = self.model_dump(mode="json", exclude={"doc_ids", "ci95"})
        low, high = self.ci95 if self.ci95 is not None else (None, None)
        return cast(Accuracy, {**block, "ci95_low": low, "ci95_high": high})


def write_accuracy(result_dir: Path, record: AccuracyRecord) -> None:
    write_atomic(result_dir / ACCURACY_JSON, json.dumps(record.model_dump(mode="json"), indent=1) + "\n")


def read_accuracy(result_dir: Path) -> AccuracyRecord | None:
    """accuracy.json of ``result_dir``, None when absent; ResultFileError when it breaks the contract."""
    return read_model(result_dir, ACCURACY_JSON, AccuracyRecord)
