"""router.json: how a routed cell's router spread the requests (docs/scaleout.md).

Written once after the replay from the router's /metrics; absent for a single engine. A figure the
router does not expose is left out (reads as None); the request counts per instance are always there,
or ``error`` says why not (a record with neither is no router's, and makes the row INVALID). The request counts are per engine instance in
the cell's order (``r<i>``; ``p<i>`` and ``d<i>`` in a disaggregated cell).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from kv_cache_tester.metrics import finite
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentsweep.contract.errors import validation_message
from agentsweep.contract.resultdir.fileio import read_model, write_atomic
from agentsweep.contract.resultdir.files import ROUTER_JSON

COUNT_LISTS = ("requests_by_replica", "requests_by_prefill", "requests_by_decode")
# What names the router and its instances (kept when its figures cannot be).
IDENTITY = frozenset({"program", "version", "mode", "policy", "policy_flag", "replicas", "prefill", "decode"})
TUPLES = frozenset({*COUNT_LISTS, "replicas", "prefill", "decode"})
FRACTIONS = (
    "busiest_replica_share",
    "busiest_prefill_share",
    "busiest_decode_share",
    "mean_prefix_match_ratio",
)


# A name (program, version, policy) is a short word; a URL a URL; past these a record is not a router's.
Name = Annotated[str, Field(max_length=200)]
Url = Annotated[str, Field(max_length=2048)]
Text = Annotated[str, Field(max_length=4096)]


class RouterRecord(BaseModel):
    """router.json. Unknown keys are refused; every figure is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    program: Name | None = None  # vllm-router | smg
    version: Name | None = None
    mode: Literal["dp", "pd"] | None = None  # data-parallel replicas, or prefill/decode
    policy: Name | None = None  # the cell's router policy (engine-neutral name)
    policy_flag: Name | None = None  # what the program was given for it
    replicas: tuple[Url, ...] | None = None  # instance URLs, in the cell's order
    prefill: tuple[Url, ...] | None = None
    decode: tuple[Url, ...] | None = None
    error: Text | None = None  # why the figures are missing (the router's /metrics was unreachable)
    requests_by_replica: tuple[float, ...] | None = None
    requests_by_prefill: tuple[float, ...] | None = None
    requests_by_decode: tuple[float, ...] | None = None
    busiest_replica_share: float | None = None
    busiest_prefill_share: float | None = None
    busiest_decode_share: float | None = None
    mean_prefix_match_ratio: float | None = None  # share of a request's text its chosen worker had seen
    policy_branches: dict[str, float] | None = None  # requests placed by each branch of the policy

    @model_validator(mode="before")
    @classmethod
    def _figures(cls, data: Any) -> Any:
        """Counts are lists of non-negative numbers, shares fractions, branches names to counts."""
        if not isinstance(data, dict):
            return data
        # Lists (as a writer builds them) stand for the tuples of a frozen record.
        data = {k: tuple(v) if isinstance(v, list) and k in TUPLES else v for k, v in data.items()}
        for key in COUNT_LISTS:
            value = data.get(key)
            if value is None:
                continue
            numbers = [finite(v) for v in value] if isinstance(value, list | tuple) else [None]
            if not numbers or any(n is None or n < 0 for n in numbers):
                raise ValueError(f"{key} must be a list of request counts, got {str(value)[:60]!r}")
        for key in FRACTIONS:
            value = data.get(key)
            number = finite(value)
            if value is not None and (number is None or not 0.0 <= number <= 1.0):
                raise ValueError(f"{key} must be a fraction 0..1, got {str(value)[:40]!r}")
        branches = data.get("policy_branches")
        if branches is not None:
            values = [finite(v) for v in branches.values()] if isinstance(branches, dict) else [None]
            if any(v is None or v < 0 for v in values):
                raise ValueError(
                    f"policy_branches must map branch names to counts, got {str(branches)[:60]!r}"
                )
        return data

    def counts_of(self, disaggregated: bool) -> dict[str, tuple[float, ...] | None]:
        """The request counts a record of a (disaggregated) cell holds, by key; None where absent."""
        keys = ("requests_by_prefill", "requests_by_decode") if disaggregated else ("requests_by_replica",)
        return {key: getattr(self, key) for key in keys}

    @classmethod
    def from_figures(cls, figures: dict[str, Any]) -> RouterRecord:
        """The record of what a router reported; figures that break the contract (a ratio past 1, a
        NaN) are left out and ``error`` says why, so the cell still leaves a readable router.json."""
        try:
            return cls.model_validate(figures)
        except ValidationError as err:
            field, what = validation_message(err, cls)
            kept = {k: v for k, v in figures.items() if k in IDENTITY}
            return cls.model_validate(
                {**kept, "error": f"the router's figures break the contract: {field or 'figures'}: {what}"}
            )

    def to_json(self) -> str:
        """Only the keys that were set (a figure the router does not expose stays out)."""
        return json.dumps(self.model_dump(mode="json", exclude_unset=True), indent=2) + "\n"


def write_router(result_dir: Path, record: RouterRecord) -> None:
    write_atomic(result_dir / ROUTER_JSON, record.to_json())


def read_router(result_dir: Path) -> RouterRecord | None:
    """router.json of ``result_dir``, None when absent; ResultFileError when it breaks the contract."""
    return read_model(result_dir, ROUTER_JSON, RouterRecord)
