"""The contract's base model and the power sampler's interval: what the sampler's spec shares with the
matrix cell, in a module light enough for the sampler's own process to import."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

MIN_POWER_INTERVAL_S = 0.05
MAX_POWER_INTERVAL_S = 60.0
# Seconds between two power samples.
PowerInterval = Annotated[float, Field(ge=MIN_POWER_INTERVAL_S, le=MAX_POWER_INTERVAL_S)]


class Frozen(BaseModel):
    """Strict, frozen, unknown keys rejected; ``.inf``/``.nan`` mean nothing in any field."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
