"""SGLang's model gateway (PyPI ``smg``): ``python -m smg launch``.

Its ``consistent_hashing`` policy keys on the ``X-SMG-Routing-Key`` header; ``cache_aware`` keeps a
prefix tree of the request text per worker. ``/readiness`` answers 200 once enough workers are
registered and healthy (``/health`` answers as soon as it listens). Its Prometheus port counts
requests per worker (``smg_worker_requests_total{worker=...}``). The metrics listener binds to all
interfaces unless told otherwise, so the host is always given.

In prefill/decode mode (``--pd-disaggregation``) every prefill instance is given with its bootstrap
port (``--prefill URL PORT``): smg sends the request to the prefill and the decode instance at once,
with the prefill's bootstrap address and a room id, and the two meet there to move the KV cache. It
counts requests per instance under the same metric.
"""

from __future__ import annotations

import re

from agentsweep.cell.routers import samples, sum_by_worker

_NAMES = {"consistent_hash": "consistent_hashing"}
_BRANCH = re.compile(r'branch="(?P<branch>[^"]*)"')


class SmgRecipe:
    program = "smg"
    distribution = "smg"
    ready_path = "/readiness"
    log_level = "warn"
    pd_flag = "--pd-disaggregation"
    pd_bootstrap = True
    pd_cached_tokens_from = "decode"  # the decode's usage passes through unchanged

    def policy_name(self, policy: str) -> str:
        return _NAMES.get(policy, policy)

    def command(self, python: str) -> list[str]:
        return [python, "-m", "smg", "launch"]

    def requests_by_worker(self, metrics_text: str) -> dict[str, float]:
        return sum_by_worker(metrics_text, "smg_worker_requests_total")

    def affinity(self, metrics_text: str) -> dict[str, object]:
        """Branches the policy took (tree_match, routing_key_hit, fallbacks) and cache_aware's mean
        prefix match ratio, the share of a request's text its chosen worker had seen."""
        out: dict[str, object] = {}
        branches: dict[str, float] = {}
        for name in ("smg_cache_aware_policy_branch_total", "smg_consistent_hashing_policy_branch_total"):
            for labels, value in samples(metrics_text, name):
                match = _BRANCH.search(labels)
                if match and value:
                    branches[match["branch"]] = branches.get(match["branch"], 0.0) + value
        if branches:
            out["policy_branches"] = branches
        total = sum(v for _, v in samples(metrics_text, "smg_cache_aware_match_ratio_sum"))
        count = sum(v for _, v in samples(metrics_text, "smg_cache_aware_match_ratio_count"))
        if count:
            out["mean_prefix_match_ratio"] = total / count
        return out


RECIPE = SmgRecipe()
