"""SGLang: ``python3 -m sglang.launch_server``.

- offload on: ``--enable-hierarchical-cache --hicache-size <GiB per rank>`` (an integer).
- noprefix: ``--disable-radix-cache``.
- disaggregated prefill/decode: ``--disaggregation-mode prefill|decode`` and
  ``--disaggregation-transfer-backend``: ``mooncake`` (SGLang's default) on NVIDIA GPUs, ``mori``
  (AMD's MoRI-IO, GPU-direct RDMA; python/sglang/srt/disaggregation/mori/, sglang PR #14626) on
  AMD ones (MI325X, MI355X); a prefill instance serves ``--disaggregation-bootstrap-port N``
  (default 8998, so each instance on a host needs its own), which the router is told (smg ``--prefill URL N``). Source:
  docs/advanced_features/pd_disaggregation.md and server_arguments.md ("PD disaggregation") in
  sgl-project/sglang. ``--disaggregation-ib-device`` is left to the engine's own detection (Mooncake
  probes the RDMA devices when it is unset); set it in ``engine_args`` where a node needs one.
"""

from __future__ import annotations

import math

from agentsweep.cell.engines import EngineLaunch, LaunchSite, ServingEngine, offload_gib
from agentsweep.contract.cell import Cell
from agentsweep.contract.hardware import AMD_HARDWARE
from agentsweep.errors import InputError

# --disaggregation-transfer-backend per runner hardware: mori on AMD GPUs, else (and on a runner that
# states no hardware) mooncake, SGLang's default.
TRANSFER_BACKEND = {hardware: "mori" for hardware in AMD_HARDWARE}


class SglangRecipe(ServingEngine):
    cache_reset_path = "/flush_cache"
    pd_bootstrap = True

    def launch(self, cell: Cell, site: LaunchSite) -> EngineLaunch:
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", cell.model]
        argv += ["--host", site.host, "--port", str(site.port), "--tp-size", str(cell.tp)]
        if cell.ep > 1:
            argv += ["--ep-size", str(cell.ep)]
        argv += ["--enable-metrics", "--enable-cache-report"]
        if cell.offload == "on":
            per_rank = math.floor(offload_gib(cell) / cell.tp)
            if per_rank <= 0:
                raise InputError(
                    f"cell {cell.exp_name}: cpu_dram_gb {cell.cpu_dram_gb:g} over tp {cell.tp} ranks "
                    "leaves no whole GiB per rank for --hicache-size"
                )
            argv += ["--enable-hierarchical-cache", "--hicache-size", str(per_rank)]
        elif cell.offload == "noprefix":
            argv.append("--disable-radix-cache")
        if site.pd is not None:
            argv += ["--disaggregation-mode", site.pd.role]
            argv += [
                "--disaggregation-transfer-backend",
                TRANSFER_BACKEND.get(site.hardware or "", "mooncake"),
            ]
            if site.pd.role == "prefill" and site.pd.bootstrap_port is not None:
                argv += ["--disaggregation-bootstrap-port", str(site.pd.bootstrap_port)]
        return EngineLaunch(argv=argv)


RECIPE = SglangRecipe()
