"""cell.json: what ran and how it ended, written on every exit path of a cell (ARCHITECTURE.md §3).

The ``cell`` it keeps is the matrix cell as given (secrets masked): a cell refused for bad input keeps
what it was given, so it stays a mapping here and ``CellRecord.parse_cell`` turns it into the typed
``Cell``. status.txt repeats the verdict and its reasons; ``write_cell_result`` writes both, status.txt
last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir.fileio import read_model, write_atomic
from agentsweep.contract.resultdir.files import CELL_JSON
from agentsweep.contract.resultdir.status import CellStatus, write_status
from agentsweep.contract.verdict import Verdict
from agentsweep.errors import InputError, ResultFileError

SCHEMA_VERSION = 1


class CellRecord(BaseModel):
    """cell.json. Only the schema version, the cell and the status are required; every value present
    must have its type (unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    schema_version: int
    cell: dict[str, Any]  # the matrix cell as given, secrets masked
    engine_command: tuple[str, ...] = ()
    engine_env: dict[str, str] = {}  # secret values masked
    replay_command: tuple[str, ...] = ()
    versions: dict[str, str | None] = {}  # agentsweep, kv_cache_tester, engine (and router when routed)
    visible_devices: dict[str, str] = {}  # CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES as the cell saw them
    start_utc: str | None = None  # ISO 8601, seconds, "Z"
    end_utc: str | None = None
    status: Verdict
    reason: str | None = None  # the reasons joined by "; " (None for SUCCESS)
    reasons: tuple[str, ...] = ()
    scaleout: dict[str, Any] | None = None  # a routed cell's plan: instances, router, placement
    # Per engine instance ("engine", or r0, p0, d0...): the settings its start-up log states and where
    # (agentsweep.cell.effective), or None when it stated none a reader knows.
    engine_settings: dict[str, dict[str, Any] | None] | None = None
    # What the cell ran on, as every reader names it: "simulated B300", "B200" (Cell.hardware_label);
    # absent for a cell that does not parse, and in a record written before it was kept.
    hardware: str | None = None
    # The manifest digest of the image the node ran (what its launcher found: agentsweep.images.local);
    # None without a container, or when the copy's digest is unknown.
    image_digest: str | None = None

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(f"{value!r}, expected {SCHEMA_VERSION}")
        return value

    @property
    def exp_name(self) -> str | None:
        """The cell's name as recorded, or None when the record has none usable."""
        name = self.cell.get("exp_name")
        return name if isinstance(name, str) and name else None

    def parse_cell(self) -> Cell:
        """The recorded cell, typed; ResultFileError naming the field when it is not a valid cell."""
        try:
            return Cell.parse(self.cell, where=f"{CELL_JSON}: cell")
        except InputError as err:
            raise ResultFileError(str(err)) from None

    @property
    def verdict(self) -> CellStatus:
        """What status.txt says for this record."""
        return CellStatus(verdict=self.status, reasons=self.reasons)

    def to_json(self) -> str:
        data = self.model_dump(mode="json")
        for optional in ("scaleout", "engine_settings", "hardware", "image_digest"):
            if data[optional] is None:
                del data[optional]
        return json.dumps(data, indent=2) + "\n"


def write_cell_record(result_dir: Path, record: CellRecord) -> None:
    write_atomic(result_dir / CELL_JSON, record.to_json())


def read_cell_record(result_dir: Path) -> CellRecord | None:
    """cell.json of ``result_dir``, None when absent; ResultFileError when it breaks the contract."""
    return read_model(result_dir, CELL_JSON, CellRecord)


def write_cell_result(result_dir: Path, record: CellRecord) -> None:
    """cell.json, then status.txt (last: its presence means the record is complete)."""
    result_dir.mkdir(parents=True, exist_ok=True)
    write_cell_record(result_dir, record)
    write_status(result_dir, record.verdict)
