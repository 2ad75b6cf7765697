"""Published serving points (the calibration CSV): reading and checking them."""

from __future__ import annotations

import csv
import math
import re
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
# Stated limits of a point (docs/engine-sim.md, "Calibration"): beyond them a row would take hours of
# simulated serving or a trace file past the replayer's limits, so it is refused, not run.
LIMITS = {"isl": 131072, "osl": 32768, "tp": 64, "ep": 64, "conc": 1024, "scheduler_recv_interval": 1000}
MAX_POINTS_BYTES = 16 << 20
MAX_FIELD_CHARS = 4096
BOOLEANS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
# The FP4 checkpoints those runs served (InferenceX's recipes): NVIDIA's NVFP4 keeps attention at FP8,
# AMD's MXFP4 quantizes every linear layer, so each is read from its own config.
FP4_CHECKPOINTS = {"mi355x": "amd/DeepSeek-R1-0528-MXFP4-Preview"}
FP4_CHECKPOINT_NVIDIA = "nvidia/DeepSeek-R1-0528-FP4-V2"
# Hardware whose points are fitted per serving-software generation, with the first SGLang image of the
# current one (the images of 2026): B200's runs of 2025 (v0.5.5-v0.5.6, most naming no image) took 0.53-0.72 s
# to a first token at 8-64 users with FP4 where its 2026 runs take 0.40-0.58 s at 16-128, and
# MI355X's 2025 run (no image stated) decodes at half the rate its 2026 runs reach at the same TP and
# concurrency (docs/engine-sim.md, "Calibration"). Points from images before the cut (or with no image
# stated) form their own group, ``<hardware>/<precision>@pre-v<cut>``.
CURRENT_GENERATION_FROM = {"b200": (0, 5, 9), "mi355x": (0, 5, 9)}
_SGLANG_IMAGE = re.compile(r"sglang:v(\d+)\.(\d+)\.(\d+)")


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
    # SGLang's --scheduler-recv-interval in the run's recipe (InferenceX's B200 recipes set 10, or 30 from
    # concurrency 16; 1, the default, elsewhere): new requests wait up to that many decode steps
    recv_interval: int = 1

    @property
    def generation(self) -> str:
        """ "" for the current serving software, else ``pre-v<cut>`` (only where the hardware is split)."""
        cut = CURRENT_GENERATION_FROM.get(self.hardware)
        if cut is None:
            return ""
        m = _SGLANG_IMAGE.search(self.row.get("image") or "")
        version = tuple(int(x) for x in m.groups()) if m else (0, 0, 0)
        return "" if version >= cut else "pre-v" + ".".join(map(str, cut))

    @property
    def group(self) -> str:
        base = f"{self.hardware}/{self.precision}"
        return f"{base}@{self.generation}" if self.generation else base

    @property
    def latency_family(self) -> str:
        """The groups whose fixed latencies (request overhead, prefill-step overhead) are fitted as one:
        the precisions of one hardware's current serving software share them (the same pinned images,
        host and scheduler; what a request waits before its prefill and what a prefill step adds do not
        depend on the weights' precision). An older generation's points span several images and
        unstated 2025 runs whose recipes differed (B200 FP4 of 2025-11-10: 0.53 s TTFT at 8 users; FP8
        a week later: 0.165 s), so each of its groups keeps its own."""
        return self.hardware if not self.generation else self.group

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
            + (f" ({self.generation})" if self.generation else "")
        )

    @property
    def measured(self) -> tuple[float, float, float]:
        return self.tput_per_gpu, self.median_intvty, self.median_ttft_s


def read_points(path: Path) -> tuple[list[str], list[Point]]:
    """(the CSV's columns, its points); bad input is an InputError naming the line and column."""
    text = _read_text(path)
    reader = csv.DictReader(text.splitlines())
    try:
        rows = list(enumerate(reader, start=2))
    except csv.Error as err:
        raise InputError(f"--points {path}: line {reader.line_num + 1}: not CSV ({err})") from None
    columns = list(reader.fieldnames or [])
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise InputError(f"--points {path}: missing column(s) {', '.join(missing)}")
    points = []
    for line, row in rows:

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
            if value > LIMITS[col]:
                raise bad(col, f"{value} is over the limit of {LIMITS[col]}")
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
        for col, raw in row.items():
            if col is None or len(raw or "") > MAX_FIELD_CHARS:  # a ragged row, or a field of megabytes
                raise bad(
                    col or "(extra fields)", f"more fields than columns, or over {MAX_FIELD_CHARS} characters"
                )
        flag = (row.get("dp_attn") or "").strip().lower()
        if flag and flag not in BOOLEANS:
            raise bad("dp_attn", f"expected true or false, got {row['dp_attn']!r}")
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
                recv_interval=integer("scheduler_recv_interval")
                if (row.get("scheduler_recv_interval") or "").strip()
                else 1,
            )
        )
    if not points:
        raise InputError(f"--points {path}: no data rows")
    return columns, points


def _read_text(path: Path) -> str:
    """The points file's text: a regular file of at most MAX_POINTS_BYTES (a FIFO would block)."""
    try:
        if not path.is_file():
            what = "no such file" if not path.exists() else "not a regular file"
            raise InputError(f"--points {path}: {what}")
        if path.stat().st_size > MAX_POINTS_BYTES:
            raise InputError(f"--points {path}: over {MAX_POINTS_BYTES >> 20} MiB; not a points file")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"--points {path}: cannot read: {getattr(err, 'strerror', None) or err}") from None
