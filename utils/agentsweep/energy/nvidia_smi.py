"""`nvidia-smi --query-gpu` in loop mode: the command and the reading of each line it prints.

The command (fields and flags as ``nvidia-smi --help-query-gpu`` and ``nvidia-smi -h`` of driver 580
name them)::

    nvidia-smi --query-gpu=timestamp,index,uuid,power.draw,temperature.gpu,utilization.gpu,memory.used
               --format=csv,noheader,nounits --id=0,1 --loop-ms=500

prints one line per GPU every 500 ms until it is stopped, e.g. (recorded on an H100)::

    2026/11/25 21:23:52.398, 0, GPU-3560572e-d4f9-3a22-8e1a-8204cd87d52b, 432.68, 56, 100, 1139

- ``timestamp``: "YYYY/MM/DD HH:MM:SS.msec", the node's local time, no zone.
- ``power.draw``: W for the entire board; on Ampere and newer the average over the last second (on
  older GPUs the instantaneous draw); accurate to +/- 5 W.
- ``temperature.gpu``: °C; ``utilization.gpu``: % of the last sample period (1/6 s to 1 s) during
  which a kernel ran; ``memory.used``: MiB allocated by active contexts.
- A figure the GPU does not report reads ``[N/A]`` (``[Not Supported]`` on some boards); a GPU
  that fell off the bus reads ``[GPU is lost]`` or ``[Unknown Error]``.

nvidia-smi's query has NO energy counter field (``total_energy_consumption`` is refused: ``Field
"total_energy_consumption" is not a valid field to query.``, exit status 2), so energy from this
source is always the integral of ``power.draw``. An unknown GPU id prints ``No devices were found``
(exit status 6).
"""

from __future__ import annotations

import calendar
import csv
import math
import shlex
import time
from collections.abc import Sequence
from typing import NamedTuple

from agentsweep.energy.powercsv import GpuReading, one_line

TOOL = "nvidia-smi"
QUERY_FIELDS: tuple[str, ...] = (
    "timestamp",
    "index",
    "uuid",
    "power.draw",
    "temperature.gpu",
    "utilization.gpu",
    "memory.used",
)
# Values that say "the GPU does not report this" (an empty cell), not a fault.
NOT_REPORTED = frozenset({"[N/A]", "N/A", "[Not Supported]", "[Not Available]", "[Unknown]"})
_FIGURE_FIELDS = {
    "power.draw": "power_w",
    "power.draw.average": "power_w",
    "temperature.gpu": "temp_c",
    "utilization.gpu": "util_pct",
    "memory.used": "mem_used_mib",
}
# Time zones are whole quarters of an hour away from UTC.
_ZONE_STEP_S = 900.0


class UnexpectedOutput(ValueError):
    """A line that is not a sample of the query (an error message, a cut line, a text figure)."""


class GpuFault(ValueError):
    """A sample line whose GPU reports a fault (``[GPU is lost]``...); ``gpu`` is its index."""

    def __init__(self, gpu: str, message: str) -> None:
        super().__init__(message)
        self.gpu = gpu


def command(ids: Sequence[str], interval_s: float, fields: Sequence[str] = QUERY_FIELDS) -> list[str]:
    """The loop command for GPUs ``ids`` (indices or UUIDs; all GPUs when empty)."""
    argv = [TOOL, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    if ids:
        argv.append(f"--id={','.join(ids)}")
    argv.append(f"--loop-ms={max(1, round(interval_s * 1000))}")
    return argv


def step_script(interval_s: float, gpus_line: str) -> str:
    """A bash script for the node's job step: ``<gpus_line> <ids>`` (the step's CUDA_VISIBLE_DEVICES),
    then the loop command for those GPUs."""
    words = shlex.join(command([], interval_s))
    return f'echo "{gpus_line} ${{CUDA_VISIBLE_DEVICES-}}"; exec {words} --id="$CUDA_VISIBLE_DEVICES"'


class Line(NamedTuple):
    stamp: str | None  # the timestamp field's text
    reading: GpuReading  # gpu: the index (the UUID when the query has no index)
    uuid: str


def parse_line(line: str, fields: Sequence[str] = QUERY_FIELDS) -> Line:
    """The timestamp, reading and UUID of one output line of a query with ``fields``.

    Raises UnexpectedOutput for a line that is not one sample, GpuFault for a GPU reporting a fault.
    """
    text = line.strip()
    try:
        cells = next(csv.reader([text], skipinitialspace=True))
    except (csv.Error, StopIteration):
        raise UnexpectedOutput(f"unexpected output: {one_line(text, 200)!r}") from None
    if len(cells) != len(fields):
        raise UnexpectedOutput(
            f"unexpected output ({len(cells)} fields, the query asks for {len(fields)}): {one_line(text, 200)!r}"
        )
    by_name = dict(zip(fields, (c.strip() for c in cells), strict=True))
    gpu = by_name.get("index") or by_name.get("uuid") or ""
    if not gpu or gpu.startswith("["):
        raise UnexpectedOutput(f"unexpected output (no GPU index): {one_line(text, 200)!r}")
    figures: dict[str, float | None] = {}
    for field, name in _FIGURE_FIELDS.items():
        if field not in by_name:
            continue
        cell = by_name[field]
        if cell in NOT_REPORTED or cell == "":
            figures[name] = None
            continue
        if cell.startswith("["):
            raise GpuFault(gpu, f"GPU {gpu} reports {field} as {cell}")
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):  # text, nan or inf where a figure belongs
            raise UnexpectedOutput(f"unexpected output ({field} is {cell!r}): {one_line(text, 200)!r}")
        figures[name] = value
    return Line(by_name.get("timestamp"), GpuReading(gpu, **figures), by_name.get("uuid", ""))


def naive_timestamp(text: str) -> float:
    """Seconds of a "YYYY/MM/DD HH:MM:SS.msec" timestamp read as if it were UTC (ValueError if not one)."""
    head, _, frac = text.strip().partition(".")
    parsed = time.strptime(head, "%Y/%m/%d %H:%M:%S")
    return calendar.timegm(parsed) + (float(f"0.{frac}") if frac.isdigit() else 0.0)


class NodeClock:
    """Turns a node's zone-less local timestamps into Unix time.

    The first line's zone offset is found against the time the line arrived, to the nearest quarter
    hour (no zone is closer to the next; output delayed by a pipe's buffer stays well inside that).
    A timestamp, unlike the arrival time, does not bunch up when the tool's output is buffered.
    """

    def __init__(self) -> None:
        self.offset_s: float | None = None

    def unix(self, stamp: str | None, arrived: float) -> float:
        if stamp is None:
            return arrived
        naive = naive_timestamp(stamp)
        if self.offset_s is None:
            self.offset_s = round((arrived - naive) / _ZONE_STEP_S) * _ZONE_STEP_S
        return naive + self.offset_s
