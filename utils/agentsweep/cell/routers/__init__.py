"""Router programs started in front of a scale-out cell's engine replicas, as plug-ins.

A router recipe (:class:`RouterRecipe`) knows one program's command line, how it names the
engine-neutral policies of the cell contract (``RouterPolicy``), where it says it is ready to route,
and how to read its own per-replica figures from its Prometheus text. ``ROUTERS`` maps each program
name of ``RouterProgram`` to the module holding its ``RECIPE``.

In a disaggregated cell the router runs in its prefill/decode mode: it is given the prefill instances
(``--prefill URL [BOOTSTRAP_PORT]``, the flag repeated per instance) and the decode instances
(``--decode URL``, repeated) instead of ``--worker-urls``, sends each request to a prefill instance
and then (vllm-router, NIXL) or at once (smg, SGLang's bootstrap rendezvous) to a decode instance.
Both programs use ``--policy`` for both roles unless ``--prefill-policy``/``--decode-policy`` are
given (``router_args`` may add them); the cell sets one policy.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from agentsweep.contract.cell import Cell
from agentsweep.errors import InputError

ROUTERS: dict[str, str] = {
    "vllm-router": "agentsweep.cell.routers.vllm_router",
    "smg": "agentsweep.cell.routers.smg",
}


@dataclass(frozen=True)
class PdWorkers:
    """The instances of a disaggregated cell as the router is told them."""

    prefill: list[tuple[str, int | str | None]]  # (URL, bootstrap port or None)
    decode: list[str]


@dataclass(frozen=True)
class RouterLaunch:
    """A resolved router start."""

    program: str
    argv: list[str]
    ready_path: str  # answers 200 once every replica is registered and healthy
    metrics_url: str


class RouterRecipe(Protocol):
    program: str
    distribution: str  # the PyPI distribution that ships it
    ready_path: str
    # In prefill/decode mode, which role's cached-token count reaches the client in the usage the
    # router returns (the other role's engine counters then do not match the client's sum).
    pd_cached_tokens_from: Literal["prefill", "decode"]
    log_level: str  # the program's name for warnings-only logging
    pd_flag: str  # the flag that switches on its prefill/decode mode
    pd_bootstrap: bool  # whether each --prefill URL is followed by the instance's bootstrap port

    def policy_name(self, policy: str) -> str:
        """The program's own name for an engine-neutral policy."""
        ...

    def command(self, python: str) -> list[str]:
        """The launch command, before the flags both programs share (``launch_argv``)."""
        ...

    def requests_by_worker(self, metrics_text: str) -> dict[str, float]:
        """Requests the router sent to each worker URL, from its /metrics text."""
        ...

    def affinity(self, metrics_text: str) -> dict[str, object]:
        """The router's own figures on how its policy chose (branches taken, prefix match), if any."""
        ...


def program_for(cell: Cell) -> str:
    """The router program of ``cell``: its ``router_program``, or the engine's own router for auto."""
    if cell.router_program != "auto":
        return cell.router_program
    return "smg" if cell.engine == "sglang" else "vllm-router"


def router_recipe(program: str) -> RouterRecipe:
    module = ROUTERS.get(program)
    if module is None:
        raise InputError(f"cell.router_program: no recipe for {program!r} (known: {', '.join(ROUTERS)})")
    found: RouterRecipe = importlib.import_module(module).RECIPE
    return found


def build_router_launch(
    cell: Cell,
    workers: Sequence[str] | PdWorkers,
    *,
    host: str,
    port: int | str,
    metrics_port: int | str,
    python: str,
) -> RouterLaunch:
    """The router of ``cell`` in front of ``workers`` (replica URLs, or the roles of a disaggregated cell)."""
    program = program_for(cell)
    recipe = router_recipe(program)
    targets = (
        pd_flags(recipe.pd_flag, workers, bootstrap=recipe.pd_bootstrap)
        if isinstance(workers, PdWorkers)
        else worker_flags(workers)
    )
    argv = launch_argv(
        recipe.command(python),
        policy=recipe.policy_name(cell.router),
        targets=targets,
        host=host,
        port=port,
        metrics_port=metrics_port,
        log_level=recipe.log_level,
    )
    argv += shlex.split(cell.router_args)  # validated as shell words when the cell was built
    return RouterLaunch(program, argv, recipe.ready_path, f"http://{host}:{metrics_port}/metrics")


def router_version(program: str) -> str | None:
    """The installed version of the program's distribution, or None when it is not installed."""
    return _installed(router_recipe(program))


def _installed(recipe: RouterRecipe) -> str | None:
    try:
        return importlib.metadata.version(recipe.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_router(recipe: RouterRecipe, python: str) -> str | None:
    """Why the router cannot start, when its distribution is missing from this interpreter (the one
    the cell starts it with); None when it is installed or runs under another interpreter."""
    if python != sys.executable or _installed(recipe) is not None:
        return None
    return (
        f"router {recipe.program} is not installed in {sys.executable}: "
        f"scale-out cells need the routers: pip install 'agentsweep[routers]' (or '{recipe.distribution}' alone)"
    )


_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_WORKER = re.compile(r'worker="(?P<url>[^"]*)"')


def samples(metrics_text: str, name: str) -> list[tuple[str, float]]:
    """(label text, value) of every sample of ``name`` (unlabelled samples have label text "")."""
    out = []
    for line in metrics_text.splitlines():
        head, _, value = line.rpartition(" ")
        metric, _, labels = head.partition("{")
        if metric != name:
            continue
        try:
            out.append((labels.rstrip("}"), float(value)))
        except ValueError:
            continue
    return out


def sum_by_worker(metrics_text: str, name: str) -> dict[str, float]:
    """The samples of ``name`` summed per ``worker`` label (other label sets are added together)."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match["name"] != name:
            continue
        worker = _WORKER.search(match["labels"])
        if worker is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        out[worker["url"]] = out.get(worker["url"], 0.0) + value
    return out


def worker_flags(urls: Sequence[str]) -> list[str]:
    return ["--worker-urls", *urls]


def pd_flags(mode_flag: str, workers: PdWorkers, *, bootstrap: bool) -> list[str]:
    """``MODE_FLAG --prefill URL [PORT] ... --decode URL ...``; bootstrap ports only when ``bootstrap``."""
    out = [mode_flag]
    for url, boot in workers.prefill:
        out += ["--prefill", url, *([str(boot)] if bootstrap and boot is not None else [])]
    for url in workers.decode:
        out += ["--decode", url]
    return out


def launch_argv(
    command: Sequence[str],
    *,
    policy: str,
    targets: Sequence[str],
    host: str,
    port: int | str,
    metrics_port: int | str,
    log_level: str,
) -> list[str]:
    """The flags vllm-router and smg both take, after ``command`` (their launch command); ``targets``
    names the workers (``worker_flags`` or ``pd_flags``)."""
    return [
        *command,
        "--host", host, "--port", str(port),
        *targets,
        "--policy", policy,
        "--prometheus-host", host, "--prometheus-port", str(metrics_port),
        "--worker-startup-check-interval", "1",
        "--log-level", log_level,
    ]  # fmt: skip
