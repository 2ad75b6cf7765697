"""The DCGM exporter's Prometheus metrics of each GPU, read with the project's Prometheus parsing.

NVIDIA's dcgm-exporter (its default counters, ``etc/default-counters.csv``) serves, per GPU (label
``gpu``, the NVML index; also ``UUID``, ``device``, ``modelName``, ``Hostname``) on port 9400::

    DCGM_FI_DEV_POWER_USAGE               gauge    power draw (W)
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION  counter  energy since boot (mJ)
    DCGM_FI_DEV_GPU_TEMP                  gauge    GPU temperature (°C)
    DCGM_FI_DEV_GPU_UTIL                  gauge    GPU utilisation (%)
    DCGM_FI_DEV_FB_USED                   gauge    framebuffer memory used (MiB)

The exporter refreshes its figures every ``-c`` milliseconds (30000 by default): scraping more often
reads the same figures again, which the energy counter tolerates (its difference over the window is
exact to one refresh) but a power integral does not; run it with ``-c 1000`` for power samples.
The simulated engine serves the same five metrics on its own /metrics (one ``gpu`` label per GPU of
its tensor-parallel group), so a simulated cell is sampled exactly like a DCGM node.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentsweep.energy.powercsv import GpuReading
from agentsweep.metrics.dialects import Exposition, parse_exposition

POWER = "DCGM_FI_DEV_POWER_USAGE"
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
TEMP = "DCGM_FI_DEV_GPU_TEMP"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FIELDS: tuple[str, ...] = (POWER, ENERGY, TEMP, UTIL, FB_USED)
DEFAULT_PORT = 9400
MJ = 1e-3  # the energy counter's unit, in J


class NotDcgm(ValueError):
    """A /metrics reply without a DCGM power metric (not a DCGM exporter, or not a simulated GPU)."""


def _by_gpu(expo: Exposition, name: str) -> dict[str, float]:
    """``name``'s value per ``gpu`` label; MIG instance series (``GPU_I_ID``) are left out."""
    out: dict[str, float] = {}
    for labels, value in expo.samples.get(name, []):
        gpu = labels.get("gpu")
        if gpu is None or labels.get("GPU_I_ID"):
            continue
        out.setdefault(gpu, value)
    return out


def parse_metrics(text: str | Exposition) -> dict[str, GpuReading]:
    """Every GPU's reading in one exposition (ValueError: not Prometheus text; NotDcgm: no power metric)."""
    expo = parse_exposition(text)
    power = _by_gpu(expo, POWER)
    if not expo.has(POWER):
        raise NotDcgm(f"no {POWER} in the reply")
    energy, temp, util, fb = (_by_gpu(expo, name) for name in (ENERGY, TEMP, UTIL, FB_USED))
    gpus = sorted(set(power) | set(energy), key=_index_order)
    return {
        gpu: GpuReading(
            gpu,
            power_w=power.get(gpu),
            energy_j=energy[gpu] * MJ if gpu in energy else None,
            temp_c=temp.get(gpu),
            util_pct=util.get(gpu),
            mem_used_mib=fb.get(gpu),
        )
        for gpu in gpus
    }


def pick(readings: dict[str, GpuReading], ids: Sequence[str]) -> tuple[list[GpuReading], list[str]]:
    """(the readings of ``ids``, the ids the reply lacks); every GPU when ``ids`` is empty."""
    if not ids:
        return list(readings.values()), []
    return [readings[i] for i in ids if i in readings], [i for i in ids if i not in readings]


def _index_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
