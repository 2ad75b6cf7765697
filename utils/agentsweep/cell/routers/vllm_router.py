"""vllm-router (PyPI ``vllm-router``): ``python -m vllm_router.launch_router``.

Its ``consistent_hash`` policy keys on the ``X-Session-ID`` header; ``cache_aware`` keeps a prefix
tree of the request text per worker. It waits for the workers itself; ``/health`` answers 200 once
they are healthy. Its Prometheus port counts requests per worker
(``vllm_router_processed_requests_total{worker=...}``).

In prefill/decode mode (``--vllm-pd-disaggregation``) it uses its default ``--kv-connector nixl``: it
sends a request to a prefill instance with ``max_tokens`` 1, then hands the prefill's
``kv_transfer_params`` to a decode instance, which pulls the KV blocks; no bootstrap port is given.
It counts requests per instance under the same metric (and ``vllm_router_pd_prefill_requests_total``
/ ``vllm_router_pd_decode_requests_total``).
"""

from __future__ import annotations

from agentsweep.cell.routers import sum_by_worker


class VllmRouterRecipe:
    program = "vllm-router"
    distribution = "vllm-router"
    ready_path = "/health"
    log_level = "warning"
    pd_flag = "--vllm-pd-disaggregation"
    pd_bootstrap = False
    # 0.1.17 puts the prefill's usage.prompt_tokens_details.cached_tokens into the decode's answer
    # (streamed and not): the client's cached tokens are the prefill's prefix hits.
    pd_cached_tokens_from = "prefill"

    def policy_name(self, policy: str) -> str:
        return policy  # the contract's names are vllm-router's own

    def command(self, python: str) -> list[str]:
        return [python, "-m", "vllm_router.launch_router"]

    def requests_by_worker(self, metrics_text: str) -> dict[str, float]:
        return sum_by_worker(metrics_text, "vllm_router_processed_requests_total")

    def affinity(self, metrics_text: str) -> dict[str, object]:
        return {}  # 0.1.17 counts decisions per worker only (requests_by_replica)


RECIPE = VllmRouterRecipe()
