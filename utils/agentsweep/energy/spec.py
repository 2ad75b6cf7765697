"""What one power sampler samples: its source and one target per node (or per simulated engine).

The cell resolves it (``agentsweep.cell.power``) and hands it to ``agentsweep power-sampler --spec``
as one JSON value; the dry run prints it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationError

from agentsweep.contract.base import Frozen, PowerInterval
from agentsweep.contract.errors import validation_message
from agentsweep.errors import InputError

# A dcgm runner's endpoint when its power_endpoint is empty: the exporter's port on each node.
DEFAULT_DCGM_ENDPOINT = "http://{address}:9400/metrics"


class PowerTarget(Frozen):
    """The GPUs of the cell that one tool run (or one endpoint) reports.

    ``gpus``: their ids as the source names them. Empty for a node other than the cell's own: the ids
    are then learnt inside the node's job step (``prefix``), which prints them on a first line
    ``#gpus <id,id,...>``; ``count`` is how many the cell expects there either way.
    """

    node: str
    count: Annotated[int, Field(gt=0)]
    gpus: tuple[str, ...] = ()
    label: str = ""  # prefixed to each GPU's id in power.csv ("r0" -> "r0/0"): several engines on a node
    endpoint: str = ""  # dcgm: the metrics URL
    prefix: tuple[str, ...] = ()  # words that run a command in a job step on the node; empty: here

    def gpu_name(self, gpu: str) -> str:
        return f"{self.label}/{gpu}" if self.label else gpu


class SamplerSpec(Frozen):
    source: Literal["dcgm", "nvidia-smi", "amd-smi"]
    interval_s: PowerInterval = 0.5
    targets: Annotated[tuple[PowerTarget, ...], Field(min_length=1)]

    @property
    def expected_gpus(self) -> int:
        return sum(t.count for t in self.targets)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def parse(cls, text: str, where: str = "--spec") -> SamplerSpec:
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            field, what = validation_message(err, cls)
            raise InputError(f"{where}.{field}: {what}" if field else f"{where}: {what}") from None
