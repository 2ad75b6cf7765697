"""The real routers (vllm-router, smg) in front of simulated engine replicas on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable

import pytest
from agentsweep.cell.placement import free_port
from agentsweep.cell.routers import RouterLaunch, build_router_launch, router_recipe
from agentsweep.contract.cell import Cell
from kv_cache_tester.replay.loop import SESSION_HEADERS

from tests.support import wait_for_http

from .conftest import MODEL

pytestmark = pytest.mark.slow

PROGRAMS = ("vllm-router", "smg")


# What round_robin's count checks is the policy: on a machine busy with the rest of the suite, smg's
# health checks, circuit breaker or retries may take a slow replica out for a request.
STEADY_SMG = "--disable-health-check --disable-circuit-breaker --disable-retries"


def _cell(program: str, policy: str, router_args: str = "") -> Cell:
    return Cell.parse(
        {
            "exp_name": "r", "tp": 1, "users": 1, "offload": "off", "engine": "sim", "hardware": "h200", "model": MODEL,
            "duration": 5, "traces": "t", "replicas": 2, "router": policy, "router_program": program,
            "router_args": router_args,
        }
    )  # fmt: skip


def _start_router(
    start_process: Callable[..., subprocess.Popen[bytes]],
    program: str,
    policy: str,
    workers: list[str],
    router_args: str = "",
) -> tuple[RouterLaunch, str]:
    port = free_port()
    launch = build_router_launch(
        _cell(program, policy, router_args),
        workers,
        host="127.0.0.1",
        port=port,
        metrics_port=free_port(),
        python=sys.executable,
    )
    proc = start_process(launch.argv, program)
    url = f"http://127.0.0.1:{port}"
    wait_for_http(url + launch.ready_path, timeout=60, process=proc)
    return launch, url


def _chat(url: str, session: str | None, text: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4, "stream": False}
    headers = {"Content-Type": "application/json"}
    if session is not None:
        headers.update({name: session for name in SESSION_HEADERS})
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        assert json.loads(resp.read())["usage"]["prompt_tokens"] > 0


def _counts(launch: RouterLaunch, workers: list[str]) -> list[float]:
    with urllib.request.urlopen(launch.metrics_url, timeout=5) as resp:
        by_worker = router_recipe(launch.program).requests_by_worker(resp.read().decode())
    return [by_worker.get(w, 0.0) for w in workers]


@pytest.mark.parametrize("program", PROGRAMS)
def test_consistent_hash_keeps_each_session_on_one_replica(program, sim_replicas, start_process):
    launch, url = _start_router(start_process, program, "consistent_hash", sim_replicas)
    homes = set()
    # Where a session lands depends on the ring, whose points come from the replicas' URLs (free ports,
    # new each run): however the ring falls, sessions keep landing on it until both replicas have
    # had one (a bounded number: an even split needs about two, a 9:1 split fewer than 40).
    for session in range(40):
        before = _counts(launch, sim_replicas)
        for turn in range(4):  # every turn's text differs: only the session header can keep them together
            _chat(url, f"trace-{session}", f"session {session} turn {turn} " + "word " * (7 * turn + session))
        after = _counts(launch, sim_replicas)
        delta = [a - b for a, b in zip(after, before, strict=True)]
        assert sorted(delta) == [0.0, 4.0], (session, delta)  # every turn of a session on one replica
        homes.add(delta.index(4.0))
        if homes == {0, 1}:
            break
    assert homes == {0, 1}  # sessions hash onto both replicas


@pytest.mark.parametrize("program", PROGRAMS)
def test_round_robin_alternates_between_replicas(program, sim_replicas, start_process):
    steady = STEADY_SMG if program == "smg" else ""
    launch, url = _start_router(start_process, program, "round_robin", sim_replicas, steady)
    for turn in range(6):
        _chat(url, "one-session", f"turn {turn}")
    counts = _counts(launch, sim_replicas)
    if program == "vllm-router":
        assert counts == [3.0, 3.0]
    else:
        # smg's round robin takes one turn of its counter now and then for a pick of its own that no
        # request counts (seen twice on a busy machine with every check above off: 4 and 2, not 3 and 3):
        # one session's requests still spread over both replicas, which no session-keeping policy does.
        assert sum(counts) == 6.0 and min(counts) >= 2.0, counts


@pytest.mark.parametrize("program", PROGRAMS)
def test_cache_aware_follows_the_shared_prefix(program, sim_replicas, start_process):
    launch, url = _start_router(start_process, program, "cache_aware", sim_replicas)
    prefix = "You are a coding agent working in a large repository. " * 40
    for turn in range(6):  # one growing conversation, no session header
        _chat(url, None, prefix + "tool output " * (10 * turn))
    assert sorted(_counts(launch, sim_replicas)) == [0.0, 6.0]


@pytest.mark.parametrize(
    ("program", "flag"), [("vllm-router", "consistent_hash"), ("smg", "consistent_hashing")]
)
def test_policy_names_map_to_each_program(program: str, flag: str) -> None:
    argv = build_router_launch(
        _cell(program, "consistent_hash"), ["http://127.0.0.1:1"], host="127.0.0.1", port=2, metrics_port=3,
        python="py",
    ).argv  # fmt: skip
    assert argv[argv.index("--policy") + 1] == flag
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"  # never all interfaces


def test_router_args_come_after_the_recipes_own() -> None:
    cell = _cell("smg", "cache_aware").replace(
        router_args="--disable-worker-overload-protection --cache-threshold 0.5"
    )
    argv = build_router_launch(
        cell, ["http://127.0.0.1:1"], host="127.0.0.1", port=2, metrics_port=3, python="py"
    ).argv
    assert argv[-3:] == ["--disable-worker-overload-protection", "--cache-threshold", "0.5"]
    assert argv[:4] == ["py", "-m", "smg", "launch"]


SMG_CACHE_AWARE_METRICS = """\
# TYPE smg_cache_aware_policy_branch_total counter
smg_cache_aware_policy_branch_total{branch="expected_wait_fallback"} 19
smg_cache_aware_policy_branch_total{branch="tree_match"} 344
smg_cache_aware_policy_branch_total{branch="load_balance"} 0
smg_cache_aware_match_ratio_sum 328.6064811699263
smg_cache_aware_match_ratio_count 363
smg_worker_requests_total{worker="http://127.0.0.1:1",model="m"} 182
smg_worker_requests_total{worker="http://127.0.0.1:2",model="m"} 181
"""


def test_smg_affinity_figures_from_its_metrics() -> None:
    smg = router_recipe("smg")
    assert smg.requests_by_worker(SMG_CACHE_AWARE_METRICS) == {
        "http://127.0.0.1:1": 182,
        "http://127.0.0.1:2": 181,
    }
    figures = smg.affinity(SMG_CACHE_AWARE_METRICS)
    assert figures["policy_branches"] == {"expected_wait_fallback": 19, "tree_match": 344}
    assert figures["mean_prefix_match_ratio"] == pytest.approx(328.6064811699263 / 363)
    assert router_recipe("vllm-router").affinity(SMG_CACHE_AWARE_METRICS) == {}


def test_a_router_missing_from_the_cells_interpreter_is_named_before_anything_starts() -> None:
    import sys

    from agentsweep.cell.routers import missing_router, router_recipe
    from agentsweep.cell.routers.smg import SmgRecipe

    class Absent(SmgRecipe):
        distribution = "agentsweep-test-no-such-router"

    assert missing_router(router_recipe("smg"), sys.executable) is None  # installed here
    reason = missing_router(Absent(), sys.executable)
    assert reason == (
        f"router smg is not installed in {sys.executable}: "
        "scale-out cells need the routers: pip install 'agentsweep[routers]' "
        "(or 'agentsweep-test-no-such-router' alone)"
    )
    assert missing_router(Absent(), "/opt/other/python") is None  # another interpreter: not ours to say
