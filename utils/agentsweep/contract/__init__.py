"""The contracts every part shares, at the bottom of the package: the matrix cell and its enums (here),
and the cell result directory with the one reader and writer of each of its files
(``agentsweep.contract.resultdir``).

Nothing here imports another part of agentsweep (only ``agentsweep.errors``; the replayer's
``kv_cache_tester`` is below it).
"""

from typing import TYPE_CHECKING

from agentsweep.contract.lazy import lazy_exports

if TYPE_CHECKING:
    from agentsweep.contract.cell import (
        APIS,
        CELL_ENV_VAR,
        CELL_FIELDS,
        CLIENTS,
        CONNECTORS,
        ENGINES,
        ENTRY_FIELDS,
        HARDWARE,
        OFFLOAD_MODES,
        REPLAY_FIELDS,
        RUNNER_FACTS,
        SAFE_NAME,
        SIMULATED_ENGINE,
        TIMING_STRATEGIES,
        VALIDITY_FIELDS,
        Api,
        Cell,
        CellAxes,
        Client,
        Engine,
        EngineSettings,
        Hardware,
        Offload,
        OffloadConnector,
        ReplayOptions,
        RunnerFacts,
        TimingStrategy,
        ValidityLimits,
    )
    from agentsweep.contract.hardware import AMD_HARDWARE, hardware_label, is_amd

__all__ = [
    "AMD_HARDWARE",
    "APIS",
    "CELL_ENV_VAR",
    "CELL_FIELDS",
    "CLIENTS",
    "CONNECTORS",
    "ENGINES",
    "ENTRY_FIELDS",
    "HARDWARE",
    "OFFLOAD_MODES",
    "REPLAY_FIELDS",
    "RUNNER_FACTS",
    "SAFE_NAME",
    "SIMULATED_ENGINE",
    "TIMING_STRATEGIES",
    "VALIDITY_FIELDS",
    "Api",
    "Cell",
    "CellAxes",
    "Client",
    "Engine",
    "EngineSettings",
    "Hardware",
    "Offload",
    "OffloadConnector",
    "ReplayOptions",
    "RunnerFacts",
    "TimingStrategy",
    "ValidityLimits",
    "hardware_label",
    "is_amd",
]

# Imported on first use (contract.lazy), from the first of these modules that has the name: a
# process may need one light module of this package only.
__getattr__ = lazy_exports(
    __name__,
    __all__,
    ("agentsweep.contract.hardware", "agentsweep.contract.cell"),
    globals(),
)
