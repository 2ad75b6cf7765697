"""power.csv: the GPU power samples of one cell, written by the power sampler and read back here only.

One row per GPU per sample, in the order samples arrived (every node of the cell in one file)::

    time_s,node,gpu,power_w,energy_j,temp_c,util_pct,mem_used_mib,fault

- ``time_s``: Unix time on the cell's node 0 (the replayer's clock) when the sample was taken.
- ``node``, ``gpu``: where the GPU is and its id as the source names it (nvidia-smi's index, amd-smi's
  GPU id, the DCGM exporter's ``gpu`` label); a simulated engine instance's GPUs are ``<instance>/<id>``.
- ``power_w`` (W), ``energy_j`` (J, the GPU's own cumulative energy counter, empty where it has
  none), ``temp_c`` (°C), ``util_pct`` (%), ``mem_used_mib`` (MiB): empty when the source reports
  none (``[N/A]``), never a zero.
- ``fault``: empty on a sample. A row with a fault is not a sample: it says, in one line, what went
  wrong with the source (tool missing, failing, printing something unexpected with the line, a GPU
  gone, an endpoint refusing), at the time it happened; ``gpu`` is set when it concerns one GPU.

The reader streams the file a row at a time. A row with another number of cells, a time that is not
a number, or longer than ``ROW_MAX_BYTES`` is unreadable: counted in ``bad_rows`` and skipped.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from kv_cache_tester.inputfiles import InputFileProblem, open_regular

from agentsweep.contract.resultdir.fileio import finite_number
from agentsweep.contract.resultdir.files import POWER_CSV
from agentsweep.errors import InputError, ResultFileError

COLUMNS: tuple[str, ...] = (
    "time_s",
    "node",
    "gpu",
    "power_w",
    "energy_j",
    "temp_c",
    "util_pct",
    "mem_used_mib",
    "fault",
)
FIGURES: tuple[str, ...] = ("power_w", "energy_j", "temp_c", "util_pct", "mem_used_mib")
ROW_MAX_BYTES = 4 << 10
FAULT_MAX_CHARS = 400


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What a source said about one GPU at one moment (None: not reported)."""

    gpu: str
    power_w: float | None = None
    energy_j: float | None = None
    temp_c: float | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None


@dataclass(frozen=True, slots=True)
class PowerRow:
    """One readable row: a sample (``fault`` empty) or a fault."""

    time_s: float
    node: str
    gpu: str
    power_w: float | None = None
    energy_j: float | None = None
    temp_c: float | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    fault: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """(node, gpu): one GPU of the cell."""
        return self.node, self.gpu


def one_line(text: str, limit: int = FAULT_MAX_CHARS) -> str:
    """``text`` on one line (whitespace runs folded), cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _cell(value: float | None) -> str:
    """A figure as written: empty when not reported (a non-finite figure is not one either)."""
    return "" if value is None or not math.isfinite(value) else f"{value:.12g}"


class PowerCsvWriter:
    """Appends rows to power.csv, each flushed as written (the file survives a killed sampler).

    A new or empty file gets the header; an existing one must be a power.csv (its first line is the
    header) or ``InputError`` refuses to append to it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        new = _check_existing(path)
        try:
            self._fh: TextIO = path.open("a", newline="", encoding="utf-8")
        except OSError as err:
            raise InputError(f"--output {path}: cannot write: {err.strerror or err}") from None
        self._csv = csv.writer(self._fh)
        if new:
            self._csv.writerow(COLUMNS)
            self._fh.flush()

    def sample(self, time_s: float, node: str, reading: GpuReading) -> None:
        self._csv.writerow(
            [
                f"{time_s:.3f}",
                node,
                reading.gpu,
                _cell(reading.power_w),
                _cell(reading.energy_j),
                _cell(reading.temp_c),
                _cell(reading.util_pct),
                _cell(reading.mem_used_mib),
                "",
            ]
        )
        self._fh.flush()

    def fault(self, time_s: float, node: str, text: str, gpu: str = "") -> None:
        self._csv.writerow([f"{time_s:.3f}", node, gpu, "", "", "", "", "", one_line(text)])
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> PowerCsvWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _check_existing(path: Path) -> bool:
    """True for a new (absent or empty) file; an existing one must start with the header."""
    try:
        if not path.exists() or path.stat().st_size == 0:
            return True
        with path.open("rb") as fh:
            first = fh.readline(4096)
    except OSError as err:
        raise InputError(f"--output {path}: cannot read: {err.strerror or err}") from None
    if first.rstrip(b"\r\n").decode("utf-8", errors="replace") != ",".join(COLUMNS):
        raise InputError(
            f"--output {path}: exists and is not a {POWER_CSV} (first line is not its header); "
            "refusing to append to it"
        )
    return False


class PowerCsvReader:
    """The readable rows of one power.csv, in file order (iterate it; each iteration reads again).

    ``ResultFileError`` when the file is missing, not a regular file, or its header is not power.csv's.
    After an iteration ``bad_rows`` counts the rows skipped and ``first_bad_line`` names the first.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        self.bad_rows = 0
        self.first_bad_line = 0

    def __iter__(self) -> Iterator[PowerRow]:
        self.bad_rows = 0
        self.first_bad_line = 0
        if not self.path.exists() and not self.path.is_symlink():
            raise ResultFileError(f"{self.name} missing")
        try:
            fh = open_regular(self.path, follow_links=False)
        except InputFileProblem as err:
            raise ResultFileError(f"{self.name}: {err}") from None
        with fh:
            rows = csv.reader(self._lines(fh))
            try:
                header = tuple(next(rows, []))
                if header != COLUMNS:
                    raise ResultFileError(
                        f"{self.name}: line 1: not the power.csv header ({','.join(COLUMNS)})"
                    )
                for row in rows:
                    if not row:
                        continue
                    parsed = self._row(row)
                    if parsed is None:
                        self._bad(rows.line_num)
                    else:
                        yield parsed
            except csv.Error as err:
                raise ResultFileError(f"{self.name}: line {rows.line_num}: {err}") from None
            except OSError as err:
                raise ResultFileError(f"{self.name}: unreadable ({err.strerror or err})") from None

    def _bad(self, line: int) -> None:
        self.bad_rows += 1
        if not self.first_bad_line:
            self.first_bad_line = line

    def _lines(self, fh: BinaryIO) -> Iterator[str]:
        number = 0
        while True:
            line = fh.readline(ROW_MAX_BYTES + 1)
            if not line:
                return
            number += 1
            if len(line) > ROW_MAX_BYTES and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):
                    line = fh.readline(ROW_MAX_BYTES)
                self._bad(number)
                yield "\n"  # keeps csv's line count in step with the file
                continue
            yield line.decode("utf-8", "replace")

    @staticmethod
    def _row(row: list[str]) -> PowerRow | None:
        if len(row) != len(COLUMNS):
            return None
        time_s = finite_number(row[0])
        if time_s is None:
            return None
        power, energy, temp, util, mem = (finite_number(cell) if cell.strip() else None for cell in row[3:8])
        return PowerRow(time_s, row[1], row[2], power, energy, temp, util, mem, row[8].strip())


def read_power(path: Path) -> list[PowerRow]:
    """Every readable row of a power.csv (see PowerCsvReader; for files known to be small)."""
    return list(PowerCsvReader(path))
