"""`amd-smi metric --json`: the command and the reading of its JSON document.

The command (options as AMD SMI's CLI documentation gives them for ``amd-smi metric``)::

    amd-smi metric -g 0 1 --power --temperature --usage --mem-usage --energy --json

prints one document per call: a list with one object per GPU (ROCm 6.x), or an object whose
``gpu_data`` holds that list (ROCm 7.x). Each figure is ``{"value": V, "unit": U}``, or ``"N/A"`` when
the GPU does not report it:

- ``power.socket_power``: W (the socket's current power; MI300 and newer report current, older
  boards the average);
- ``energy.total_energy_consumption``: J, the GPU's energy accumulator (counter x resolution), so
  this source has an energy counter;
- ``temperature.hotspot`` (junction), else ``temperature.edge``: °C;
- ``usage.gfx_activity``: %;
- ``mem_usage.used_vram``: "MB" as amd-smi names it, computed as bytes // 2**20, so MiB.

``amd-smi metric --watch`` printed nothing with ``--json`` in ROCm 7.1.1 (ROCm/amdsmi issue 168), so
the sampler calls it once per interval in a shell loop instead (``loop_script``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from agentsweep.energy.powercsv import GpuReading, one_line

TOOL = "amd-smi"
METRIC_FLAGS: tuple[str, ...] = ("--power", "--temperature", "--usage", "--mem-usage", "--energy", "--json")
# Lines the loop prints around each document.
END = "#end"
FAIL = "#fail"

_POWER_UNITS = {"W": 1.0, "mW": 1e-3, "uW": 1e-6, "kW": 1e3}
_ENERGY_UNITS = {"J": 1.0, "mJ": 1e-3, "uJ": 1e-6, "kJ": 1e3}
_MEMORY_UNITS = {"MB": 1.0, "MiB": 1.0, "GB": 1024.0, "GiB": 1024.0, "KB": 1 / 1024, "B": 1 / 2**20}
_TEMP_UNITS = {"C": 1.0, "°C": 1.0, "\u2103": 1.0}
_PERCENT_UNITS = {"%": 1.0}


class UnexpectedDocument(ValueError):
    """Output that is not an ``amd-smi metric --json`` document, or a figure that is not one."""


def command(ids: Sequence[str]) -> list[str]:
    """One call for GPUs ``ids`` (amd-smi GPU ids; every GPU when empty)."""
    argv = [TOOL, "metric"]
    if ids:
        argv += ["-g", *ids]
    return argv + list(METRIC_FLAGS)


def loop_script(ids: Sequence[str], interval_s: float) -> str:
    """A bash loop: the document, ``#fail <status>`` when the call failed, ``#end``; every interval."""
    call = shlex.join(command(ids))
    return f'while :; do {call} || echo "{FAIL} $?"; echo "{END}"; sleep {interval_s:g}; done'


def step_script(count: int, interval_s: float, gpus_line: str) -> str:
    """A bash script for the node's job step: ``<gpus_line> <ids>`` (the first ``count`` GPUs of the
    step's ROCR_VISIBLE_DEVICES, the cell's on that node), then the loop over them."""
    call = shlex.join(command([])[:2]) + " -g $ids " + shlex.join(METRIC_FLAGS)
    loop = f'while :; do {call} || echo "{FAIL} $?"; echo "{END}"; sleep {interval_s:g}; done'
    pick = f'ids=$(printf %s "${{ROCR_VISIBLE_DEVICES-}}" | tr , "\\n" | head -n {count} | paste -sd, -)'
    return f'{pick}; echo "{gpus_line} $ids"; ids=${{ids//,/ }}; {loop}'


def _figure(value: Any, units: dict[str, float], what: str) -> float | None:
    """A ``{"value", "unit"}`` figure (or a bare number) in the unit the table's 1.0 stands for."""
    if value is None or value == "N/A" or (isinstance(value, str) and value.strip().upper() == "N/A"):
        return None
    unit = None
    if isinstance(value, dict):
        unit = value.get("unit")
        value = value.get("value")
        if value == "N/A":
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnexpectedDocument(f"{what} is {one_line(json.dumps(value), 80)}, not a number")
    scale = 1.0 if unit is None else units.get(str(unit))
    if scale is None:
        raise UnexpectedDocument(f"{what} has unit {unit!r} (expected one of {', '.join(units)})")
    return float(value) * scale


def parse_document(text: str) -> list[GpuReading]:
    """The readings of one ``amd-smi metric --json`` document (UnexpectedDocument if it is not one)."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise UnexpectedDocument(f"not JSON: {one_line(text, 200)!r}") from None
    if isinstance(doc, dict) and "gpu_data" in doc:
        doc = doc["gpu_data"]
    if not isinstance(doc, list):
        raise UnexpectedDocument(f"not a list of GPUs: {one_line(text, 200)!r}")
    out: list[GpuReading] = []
    for item in doc:
        if not isinstance(item, dict) or "gpu" not in item:
            raise UnexpectedDocument(f"a GPU entry without 'gpu': {one_line(json.dumps(item), 200)}")
        gpu = str(item["gpu"])
        where = f"GPU {gpu}"
        power = _section(item, "power")
        temps = _section(item, "temperature")
        usage = _section(item, "usage")
        memory = _section(item, "mem_usage")
        energy = _section(item, "energy")
        temp = _figure(temps.get("hotspot"), _TEMP_UNITS, f"{where} temperature.hotspot")
        if temp is None:
            temp = _figure(temps.get("edge"), _TEMP_UNITS, f"{where} temperature.edge")
        out.append(
            GpuReading(
                gpu,
                power_w=_figure(power.get("socket_power"), _POWER_UNITS, f"{where} power.socket_power"),
                energy_j=_figure(
                    energy.get("total_energy_consumption"),
                    _ENERGY_UNITS,
                    f"{where} energy.total_energy_consumption",
                ),
                temp_c=temp,
                util_pct=_figure(usage.get("gfx_activity"), _PERCENT_UNITS, f"{where} usage.gfx_activity"),
                mem_used_mib=_figure(memory.get("used_vram"), _MEMORY_UNITS, f"{where} mem_usage.used_vram"),
            )
        )
    return out


def _section(item: dict[str, Any], name: str) -> dict[str, Any]:
    """A GPU entry's section; ``"N/A"`` or absent (the GPU reports none of it) reads as empty."""
    section = item.get(name)
    if section is None or section == "N/A":
        return {}
    if not isinstance(section, dict):
        raise UnexpectedDocument(f"GPU {item.get('gpu')}: {name} is {one_line(json.dumps(section), 80)}")
    return section
