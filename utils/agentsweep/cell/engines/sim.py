"""The simulated engine: ``agentsweep engine-sim``, with the profile of the cell's hardware.

- the GPU it simulates: ``--hardware``, the cell's hardware (its runner's). A simulated cell without
  one is refused (bad input): its figures would be some other GPU's under its runner's name.

- offload on: ``--kv-offloading-size <GiB>`` (a CPU tier of that size).
- noprefix: ``--no-enable-prefix-caching``.
- disaggregated prefill/decode: ``--disaggregation-mode prefill|decode``; a prefill instance always
  gets ``--disaggregation-bootstrap-port N`` (the simulated engine answers both the vLLM-style and the
  SGLang-style protocol, so either router can front it); ``--kv-transfer-gbs F``, the runner's KV
  transfer bandwidth per GPU (``intra_node_gbs``, or ``inter_node_gbs`` for a cell on several nodes).
  The transfer latency is left to the simulated engine's default.
"""

from __future__ import annotations

import agentsweep
from agentsweep.cell.engines import EngineLaunch, LaunchSite, fmt_gib, fmt_num, offload_gib
from agentsweep.contract.cell import HARDWARE, Cell
from agentsweep.errors import InputError

# Cell precision -> the simulated engine's --quantization (weights bytes per parameter).
WEIGHT_PRECISION = {
    "bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4",
}  # fmt: skip


class SimRecipe:
    startup_margin_s = 120
    health_timeout_s = 120.0
    stop_grace_s = 5.0
    simulated = True
    pd_bootstrap = True
    pd_side_channel = False
    cache_reset_path = "/reset_prefix_cache"  # it answers SGLang's /flush_cache too
    step_overhead_s = 10.0

    def launch(self, cell: Cell, site: LaunchSite) -> EngineLaunch:
        argv = [site.python, "-m", "agentsweep.cli", "engine-sim", cell.model]
        argv += ["--host", site.host, "--port", str(site.port), "--tensor-parallel-size", str(cell.tp)]
        if cell.ep > 1:
            argv += ["--ep-size", str(cell.ep)]
        if not site.hardware:
            raise InputError(
                f"cell {cell.exp_name}: hardware: a simulated cell names the GPU it simulates "
                f"({', '.join(HARDWARE)}), and runner '{cell.runner}' states none; set hardware in its "
                "runners.yaml entry"
            )
        argv += ["--hardware", site.hardware, "--speed", fmt_num(cell.speed)]
        weights = WEIGHT_PRECISION.get(cell.precision.lower())
        if weights:  # the simulated weights footprint follows the cell's precision, not the model id
            argv += ["--quantization", weights]
        if cell.offload == "on":
            argv += ["--kv-offloading-size", fmt_gib(offload_gib(cell))]
        elif cell.offload == "noprefix":
            argv.append("--no-enable-prefix-caching")
        if site.pd is not None:
            argv += ["--disaggregation-mode", site.pd.role]
            if site.pd.role == "prefill" and site.pd.bootstrap_port is not None:
                argv += ["--disaggregation-bootstrap-port", str(site.pd.bootstrap_port)]
            if site.pd.kv_transfer_gbs is not None:
                argv += ["--kv-transfer-gbs", fmt_num(site.pd.kv_transfer_gbs)]
        return EngineLaunch(argv=argv)

    def kv_events_args(self, endpoint: str) -> list[str]:
        return []  # its evictions are a counter on /metrics

    def version(self, base_url: str) -> str | None:
        return agentsweep.__version__


RECIPE = SimRecipe()
