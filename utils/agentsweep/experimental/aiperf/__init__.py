"""AIPerf as an alternative cell client (``client: aiperf``); docs: docs/experimental.md.

The cell runner calls :func:`aiperf_command` (argv, like ``replay_command``) or :func:`run_aiperf_cell`.
"""

from agentsweep.experimental.aiperf.cell import aiperf_command, run_aiperf_cell

__all__ = ["aiperf_command", "run_aiperf_cell"]
