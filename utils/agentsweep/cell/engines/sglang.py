"""SGLang: ``python3 -m sglang.launch_server``.

- offload on: ``--enable-hierarchical-cache --hicache-size <GiB per rank>`` (an integer).
- noprefix: ``--disable-radix-cache``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agentsweep.cell.engines import EngineLaunch, ServingEngine, offload_gib
from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError


class SglangRecipe(ServingEngine):
    def launch(
        self,
        cell: Cell,
        *,
        hardware: str | None,
        port: int | str,
        host: str,
        python: str,
        environ: Mapping[str, str],
    ) -> EngineLaunch:
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", cell.model]
        argv += ["--host", host, "--port", str(port), "--tp-size", str(cell.tp)]
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
        return EngineLaunch(argv=argv)


RECIPE = SglangRecipe()
