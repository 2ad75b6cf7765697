"""The GPUs a cell can name: a runner's hardware, and what a simulated cell simulates.

Every key of the simulated engine's profiles (``agentsweep.engine_sim.profiles.HARDWARE``) is one of
them, and every one of them has a profile: a sweep can target each simulated GPU. ``hardware_label``
is how every reader names what a cell ran on (reports, summary.csv, the store, the export).
"""

from __future__ import annotations

from typing import Literal, get_args

Hardware = Literal["h200", "b200", "b300", "gb200", "gb300", "mi325x", "mi355x"]
HARDWARE: tuple[str, ...] = get_args(Hardware)
# AMD GPUs: ROCm's device variables, amd-smi, and the recipes' ROCm quirks.
AMD_HARDWARE: frozenset[str] = frozenset({"mi325x", "mi355x"})
# What a simulated cell that states no hardware ran as: a result written before every simulated cell
# had to state one, when the simulated engine started as an H200 by default. Readers of such results
# (the power bound, the export's hw) take it; nothing new is defaulted to it.
LEGACY_SIM_HARDWARE: Hardware = "h200"


def is_amd(hardware: str) -> bool:
    """True for an AMD Instinct GPU (ROCm); False for an NVIDIA one or an unknown hardware."""
    return hardware in AMD_HARDWARE


def hardware_label(simulated: bool, hardware: str, runner: str = "") -> str:
    """``B300`` on the GPU itself, ``simulated B300`` when the simulated engine stood in for it.

    A real engine on a runner that states no hardware is named by its runner; a simulated cell that
    states none (a result written before every simulated cell had to) says so.
    """
    if hardware:
        return f"simulated {hardware.upper()}" if simulated else hardware.upper()
    if simulated:
        return "simulated, hardware not stated"
    return f"runner {runner}" if runner else ""
