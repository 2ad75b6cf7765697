"""Published serving points (the calibration CSV): reading and checking them."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from agentsweep.engine_sim.profiles import HARDWARE
from agentsweep.errors import InputError

REQUIRED = (
    "hardware",
    "precision",
    "isl",
    "osl",
    "tp",
    "ep",
    "conc",
    "tput_per_gpu",
    "median_intvty",
    "median_ttft_s",
)
PRECISIONS = ("bf16", "fp8", "fp4")
DATA_DIR = Path(__file__).with_name("data")
DEFAULT_POINTS = DATA_DIR / "inferencex_dsr1_sglang.csv"
MODEL_NAME = "deepseek-ai/DeepSeek-R1"  # the model every point of the shipped data set measured
# The FP4 checkpoints those runs served (InferenceX's recipes): NVIDIA's NVFP4 keeps attention at FP8,
# AMD's MXFP4 quantizes every linear layer, so each is read from its own config.
FP4_CHECKPOINTS = {"mi355x": "amd/DeepSeek-R1-0528-MXFP4-Preview"}
FP4_CHECKPOINT_NVIDIA = "nvidia/DeepSeek-R1-0528-FP4-V2"


@dataclass(frozen=True, slots=True)
class Point:
    row: dict[str, str]  # every input column, as read
    hardware: str
    precision: str
    isl: int
    osl: int
    tp: int
    ep: int
    conc: int
    tput_per_gpu: float
    median_intvty: float
    median_ttft_s: float
    line: int  # line in the CSV (for messages)

    @property
    def group(self) -> str:
        return f"{self.hardware}/{self.precision}"

    @property
    def model(self) -> str:
        """The checkpoint the point measured (the FP4 ones by vendor)."""
        if self.precision == "fp4":
            return FP4_CHECKPOINTS.get(self.hardware, FP4_CHECKPOINT_NVIDIA)
        return MODEL_NAME

    @property
    def label(self) -> str:
        return (
            f"{self.hardware} {self.precision} {self.isl}/{self.osl} tp{self.tp}"
            + (f" ep{self.ep}" if self.ep > 1 else "")
            + f" conc {self.conc}"
        )

    @property
    def measured(self) -> tuple[float, float, float]:
        return self.tput_per_gpu, self.median_intvty, self.median_ttft_s


def read_points(path: Path) -> tuple[list[str], list[Point]]:
    """(the CSV's columns, its points); bad input is an InputError naming the line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"--points {path}: cannot read: {getattr(err, 'strerror', None) or err}") from None
    reader = csv.DictReader(text.splitlines())
    columns = list(reader.fieldnames or [])
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise InputError(f"--points {path}: missing column(s) {', '.join(missing)}")
    points = []
    for line, row in enumerate(reader, start=2):

        def bad(col: str, what: str, line: int = line) -> InputError:
            return InputError(f"--points {path}: line {line}: {col}: {what}")

        def integer(col: str, row: dict[str, str] = row) -> int:
            raw = (row.get(col) or "").strip()
            try:
                value = int(raw)
            except ValueError:
                raise bad(col, f"expected a positive integer, got {raw!r}") from None
            if value < 1:
                raise bad(col, f"expected a positive integer, got {raw!r}")
            return value

        def number(col: str, row: dict[str, str] = row) -> float:
            raw = (row.get(col) or "").strip()
            try:
                value = float(raw)
            except ValueError:
                raise bad(col, f"expected a positive number, got {raw!r}") from None
            if not (math.isfinite(value) and value > 0):
                raise bad(col, f"expected a positive number, got {raw!r}")
            return value

        hw = (row.get("hardware") or "").strip().lower()
        if hw not in HARDWARE:
            raise bad("hardware", f"unknown hardware {hw!r} (expected {', '.join(sorted(HARDWARE))})")
        prec = (row.get("precision") or "").strip().lower()
        if prec not in PRECISIONS:
            raise bad("precision", f"expected one of {', '.join(PRECISIONS)}, got {prec!r}")
        tp, ep = integer("tp"), integer("ep")
        if tp % ep:
            raise bad("ep", f"{ep} must divide tp {tp}")
        points.append(
            Point(
                row=dict(row),
                hardware=hw,
                precision=prec,
                isl=integer("isl"),
                osl=integer("osl"),
                tp=tp,
                ep=ep,
                conc=integer("conc"),
                tput_per_gpu=number("tput_per_gpu"),
                median_intvty=number("median_intvty"),
                median_ttft_s=number("median_ttft_s"),
                line=line,
            )
        )
    if not points:
        raise InputError(f"--points {path}: no data rows")
    return columns, points
