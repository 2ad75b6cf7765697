"""Scale-out cells: engine instances on their own ports, a real router in front, the replayer on the router.

Two modes. Data-parallel (``dp``): N replicas ``r<i>``, each serving whole requests. Disaggregated
(``pd``): prefill instances ``p<i>`` and decode instances ``d<i>``, the router in its prefill/decode
mode sending each request through one of each, the KV cache moving between them.

Each instance is the engine recipe's command for a one-instance copy of the cell (its role's ``tp``
GPUs, its share of the offload budget, its role flags). Every instance is scraped on its own
(``server_metrics.<name>.csv``); after the replay the rows of the instances that answer the client
(the replicas, or the decode instances) are merged into ``server_metrics.csv``: counters and request
counts summed, usage fractions averaged, so the validity checks that compare client sums with server
counters hold as for one engine. The prefill instances are merged the same way into
``server_metrics.prefill.csv``. The router's own per-instance request counts go to ``router.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import shlex
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from agentsweep.cell import placement as placement_mod
from agentsweep.cell import record
from agentsweep.cell.engine_process import EngineFailed, EngineProcess, ManagedProcess, tail_lines, trim_log
from agentsweep.cell.engines import PdRole, build_engine_launch, recipe
from agentsweep.cell.plan import CellOptions, CellPlan, Replica, Role, ScaleoutPlan
from agentsweep.cell.routers import (
    PdWorkers,
    build_router_launch,
    missing_router,
    router_recipe,
    router_version,
)
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import (
    PREFILL_METRICS_CSV,
    ROUTER_METRICS_CSV,
    ROUTER_METRICS_TXT,
    ROUTER_METRICS_TXT_MAX_BYTES,
    SERVER_METRICS_CSV,
    RouterRecord,
    instance_metrics_csv,
    write_atomic,
    write_router,
)
from agentsweep.errors import InputError
from agentsweep.metrics.scrapes import merge_metrics

ROUTER_METRICS_MAX_BYTES = 8 << 20


def instance_cell(cell: Cell, tp: int) -> Cell:
    """The one-instance cell an engine instance is started for: ``tp`` GPUs, its share of the DRAM budget.

    A replica's share is ``cpu_dram_gb / replicas``; a prefill or decode instance's is
    ``cpu_dram_gb x tp / gpus`` (its GPUs' part of the cell's), both floored to 0.1 GiB.
    """
    if cell.disaggregated:
        share = math.floor(round(cell.cpu_dram_gb * tp / cell.gpus * 10, 6)) / 10
    else:
        share = math.floor(round(cell.cpu_dram_gb / cell.replicas * 10, 6)) / 10
    return cell.replace(
        replicas=1, router="", gpus=tp, tp=tp, cpu_dram_gb=share, prefill=None, decode=None, nodes=1
    )


def _shape(cell: Cell) -> str:
    if cell.prefill is not None and cell.decode is not None:
        return f"prefill {cell.prefill.label} + decode {cell.decode.label}"
    return f"{cell.replicas} replicas x tp {cell.tp}"


def device_slices(cell: Cell, hardware: str | None, environ: Mapping[str, str]) -> list[dict[str, str]]:
    """Each instance's own GPUs, in start order, as the environment its engine starts with ({} for the
    simulated engine).

    NVIDIA: instance k gets the next ``tp`` IDs of CUDA_VISIBLE_DEVICES (what the allocation gave the
    cell), or of 0..gpus-1 when it is unset. MI355X: HIP_VISIBLE_DEVICES indexes inside what
    ROCR_VISIBLE_DEVICES (set by the allocation) shows, so the indices run from 0 the same way.
    """
    tps = cell.instance_tps
    if recipe(cell.engine).simulated:
        return [{} for _ in tps]
    need = sum(tps)
    if hardware == "mi355x":
        var, ids = "HIP_VISIBLE_DEVICES", [str(i) for i in range(max(need, cell.gpus))]
    else:
        var = "CUDA_VISIBLE_DEVICES"
        given = environ.get(var, "").strip()
        ids = (
            [d.strip() for d in given.split(",") if d.strip()]
            if given
            else [str(i) for i in range(max(need, cell.gpus))]
        )
        if len(ids) < need:
            raise InputError(
                f"cell {cell.exp_name}: {_shape(cell)} need {need} GPUs but {var}={given} shows {len(ids)}"
            )
    starts = list(itertools.accumulate(tps, initial=0))
    return [{var: ",".join(ids[a : a + tp])} for a, tp in zip(starts, tps, strict=False)]


def _instances(cell: Cell) -> list[tuple[Role, str, int, int]]:
    """(role, name, index, tp) of every engine instance, in start order."""
    if cell.prefill is not None and cell.decode is not None:
        return [("prefill", f"p{i}", i, cell.prefill.tp) for i in range(cell.prefill.replicas)] + [
            ("decode", f"d{i}", i, cell.decode.tp) for i in range(cell.decode.replicas)
        ]
    return [("replica", f"r{i}", i, cell.tp) for i in range(cell.replicas)]


def plan_scaleout(
    cell: Cell,
    result_dir: Path,
    *,
    port: int | str,
    hardware: str | None,
    host: str,
    python: str,
    environ: Mapping[str, str],
    scrape_interval_s: float,
    kv_transfer_gbs: float | None = None,
    placement: placement_mod.Placement | None = None,
) -> ScaleoutPlan:
    """Ports, engine commands and scrapers of every instance, and the router on ``port``.

    With a real port the instances (and prefill bootstrap ports, KV handshake ports) and the router's
    metrics get free ports of this host; a dry run (``port`` is a placeholder) shows placeholders.
    ``kv_transfer_gbs`` (disaggregated cells) is the runner's KV transfer bandwidth per GPU for the
    cell's placement, passed to engines that model the transfer. A cell spanning several nodes of its
    Slurm job (``placement``, found from the environment when not given) starts each instance as a job
    step on its node, bound to the node's address; the router stays here, on node 0.
    """
    placement = placement or placement_mod.from_environ(cell, hardware, environ)
    real = isinstance(port, int)
    taken: set[int] = {port} if isinstance(port, int) else set()
    engine_recipe = recipe(cell.engine)
    pd_mode = cell.disaggregated
    specs = _instances(cell)
    slices = device_slices(cell, hardware, environ) if placement is None else [{}] * len(specs)
    client_name = "d0" if pd_mode else "r0"
    instances = []
    for k, ((role, name, i, tp), devices) in enumerate(zip(specs, slices, strict=True)):
        tag = f"{role.upper()}{i}"
        where = placement.slots[k] if placement is not None else None
        rhost = where.address if where is not None else host

        def new_port(what: str, tag: str = tag) -> int | str:
            return placement_mod.free_port(host, taken) if real else f"${tag}_{what}"

        rport = new_port("PORT")
        pd = None
        boot: int | str | None = None
        if pd_mode:
            if role == "prefill" and engine_recipe.pd_bootstrap:
                boot = new_port("BOOTSTRAP_PORT")
            side = new_port("NIXL_PORT") if engine_recipe.pd_side_channel else None
            pd = PdRole(
                "prefill" if role == "prefill" else "decode",
                bootstrap_port=boot,
                side_channel_port=side,
                kv_transfer_gbs=kv_transfer_gbs,
            )
        launch = build_engine_launch(
            instance_cell(cell, tp), hardware=hardware, port=rport, host=rhost, python=python,
            environ=environ, pd=pd,
        )  # fmt: skip
        launch = dataclasses.replace(launch, env={**launch.env, **devices})
        if placement is not None:  # its own step on its node; the step selects its GPUs there
            launch = dataclasses.replace(launch, argv=placement.wrap(k, launch.argv))
        url = f"http://{rhost}:{rport}"
        metrics_name = instance_metrics_csv(name)
        scraper = [
            python, "-m", "agentsweep.cli", "metrics-collector",
            "--endpoint", url + launch.metrics_path,
            "--output", str(result_dir / metrics_name),
            "--interval", f"{scrape_interval_s:g}",
        ]  # fmt: skip
        log_name = "server.log" if name == client_name else f"server.{name}.log"
        node = where.node if where is not None else placement_mod.local_node(environ)
        instances.append(
            Replica(i, rport, url, launch, log_name, metrics_name, scraper, name, role, boot, node)
        )
    metrics_port: int | str = placement_mod.free_port(host, taken) if real else "$ROUTER_METRICS_PORT"
    workers: list[str] | PdWorkers = [r.url for r in instances]
    if pd_mode:
        workers = PdWorkers(
            prefill=[(r.url, r.bootstrap_port) for r in instances if r.role == "prefill"],
            decode=[r.url for r in instances if r.role == "decode"],
        )
    router = build_router_launch(
        cell, workers, host=host, port=port, metrics_port=metrics_port, python=python
    )
    mode: Literal["dp", "pd"] = "pd" if pd_mode else "dp"
    router_scraper = [
        python, "-m", "agentsweep.cli", "router-metrics-collector",
        "--endpoint", router.metrics_url, "--program", router.program,
        *(arg for r in instances for arg in ("--instance", f"{r.name}={r.url}")),
        "--output", str(result_dir / ROUTER_METRICS_CSV),
        "--interval", f"{scrape_interval_s:g}",
    ]  # fmt: skip
    return ScaleoutPlan(instances, router, f"http://{host}:{port}", mode, placement, router_scraper)


class _Named(EngineProcess):
    """An engine replica or the router: its messages name it and its own log."""

    def __init__(self, label: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.label = label

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.2) -> float:
        try:
            return super().wait_healthy(timeout_s, poll_s)
        except EngineFailed as err:
            raise EngineFailed(self._rename(str(err))) from None

    def died_reason(self) -> str | None:
        reason = super().died_reason()
        return self._rename(reason) if reason else None

    def _rename(self, text: str) -> str:
        text = text.replace("server.log", self.log_path.name)
        return self.label + text.removeprefix("engine") if text.startswith("engine") else text


class _Group:
    """The replicas and the router seen as one engine by the replay watcher."""

    def __init__(self, members: Sequence[_Named]) -> None:
        self.members = list(members)

    def died_reason(self) -> str | None:
        for member in self.members:
            if member.proc is not None:
                reason = member.died_reason()
                if reason:
                    return reason
        return None


def execute(
    plan: CellPlan,
    options: CellOptions,
    versions: dict[str, str | None],
    say: Callable[[str], None],
    watch_replay: Callable[[Any, ManagedProcess, CellOptions, int], str | None],
    check_outputs: Callable[[Path], str | None],
) -> str | None:
    """Start the instances (prefill first), then the router, scrape every instance, replay through the
    router, stop all."""
    so = plan.scaleout
    assert so is not None
    cell, rd = plan.cell, plan.result_dir
    grace = options.engine_grace(cell.engine)
    engines = [
        _Named(
            r.label,
            r.engine.argv,
            log_path=rd / r.log_name,
            base_url=r.url,
            health_path=r.engine.health_path,
            env={**os.environ, **r.engine.env},
            stop_grace_s=grace,
        )
        for r in so.replicas
    ]
    router = _Named(
        f"router ({so.router.program})",
        so.router.argv,
        log_path=rd / "router.log",
        base_url=so.router_url,
        health_path=so.router.ready_path,
        env=dict(os.environ),
        stop_grace_s=10.0,
    )
    what = "instances" if so.mode == "pd" else "replicas"
    missing = missing_router(router_recipe(so.router.program), so.router.argv[0])
    if missing:  # before any engine loads its weights
        return missing
    reason: str | None = None
    try:
        with contextlib.ExitStack() as stack:
            for eng in engines:
                say(f"starting {eng.label}: {shlex.join(record.mask_argv(eng.argv))}")
                stack.enter_context(eng)
            start = time.monotonic()
            timeout = options.health_timeout(cell.engine)
            for eng in engines:
                eng.wait_healthy(max(0.1, timeout - (time.monotonic() - start)))
            say(f"{len(engines)} {what} healthy after {time.monotonic() - start:.1f} s")
            versions["engine"] = recipe(cell.engine).version(so.client.url)
            versions["router"] = f"{so.router.program} {router_version(so.router.program) or 'unknown'}"
            say(f"starting router: {shlex.join(so.router.argv)}")
            stack.enter_context(router)
            waited = router.wait_healthy(timeout)
            say(f"router ready after {waited:.1f} s")
            scrapers = [
                ManagedProcess(
                    r.scraper_argv,
                    log_path=rd / f"metrics-collector.{r.name}.log",
                    name=f"metrics collector of {r.label}",
                    stop_grace_s=10.0,
                )
                for r in so.replicas
            ]
            if so.router_scraper_argv:
                scrapers.append(
                    ManagedProcess(
                        so.router_scraper_argv,
                        log_path=rd / "router-metrics-collector.log",
                        name="metrics collector of the router",
                        stop_grace_s=10.0,
                    )
                )
            for scraper in scrapers:
                stack.enter_context(scraper)
            replayer = ManagedProcess(
                plan.replay_argv,
                log_path=rd / "replay.log",
                name="replayer",
                stop_grace_s=options.replay_stop_grace_s,
            )
            say(f"replaying {cell.users} users for {cell.duration} s through {so.router_url}")
            try:
                reason = watch_replay(_Group([*engines, router]), replayer, options, cell.duration)
            finally:
                replayer.stop()
            for scraper in scrapers:
                code = scraper.poll()
                if reason is None and code is not None:
                    reason = f"{scraper.name} exited early with status {code}{_hint(scraper)}"
            for scraper in scrapers:  # all take their last scrape at about the same moment
                scraper.signal_group(signal.SIGTERM)
            for scraper in scrapers:
                scraper.stop()
            if router.poll() is None:
                write_router_figures(plan, rd)
    finally:
        for name in [r.log_name for r in so.replicas if r.log_name != "server.log"] + ["router.log"]:
            trim_log(rd / name)
    merge_metrics([rd / r.metrics_name for r in so.answering], rd / SERVER_METRICS_CSV)
    if so.mode == "pd":
        merge_metrics([rd / r.metrics_name for r in so.prefill], rd / PREFILL_METRICS_CSV)
    return reason or check_outputs(rd)


def _hint(proc: ManagedProcess) -> str:
    lines = [ln.strip() for ln in tail_lines(proc.log_path, 40) if ln.strip()]
    return f"; last line of {proc.log_path.name}: {lines[-1][:300]}" if lines else ""


def router_figures(plan: CellPlan, metrics_text: str) -> dict[str, Any]:
    """What router.json says of the router's routing, from its /metrics text.

    Data-parallel: requests per replica and the busiest one's share. Prefill/decode: requests per
    prefill and per decode instance (both routers count each instance under its URL) and the busiest
    share of each role.
    """
    so = plan.scaleout
    assert so is not None
    program = router_recipe(so.router.program)
    by_worker = program.requests_by_worker(metrics_text)
    figures: dict[str, Any] = {}
    groups = (
        [("prefill", so.prefill), ("decode", so.decode)] if so.mode == "pd" else [("replica", so.replicas)]
    )
    for role, members in groups:
        counts = [by_worker.get(r.url, 0.0) for r in members]
        total = sum(counts)
        figures[f"requests_by_{role}"] = counts
        figures[f"busiest_{role}_share"] = max(counts) / total if total else None
    figures.update(program.affinity(metrics_text))
    return figures


def write_router_figures(plan: CellPlan, result_dir: Path) -> None:
    """router.json: the router's requests per instance (and its metrics text, histograms left out)."""
    so = plan.scaleout
    assert so is not None
    figures: dict[str, Any] = {
        "program": so.router.program,
        "version": router_version(so.router.program),
        "mode": so.mode,
        "policy": plan.cell.router,
        "policy_flag": router_recipe(so.router.program).policy_name(plan.cell.router),
    }
    if so.mode == "pd":
        figures["prefill"] = [r.url for r in so.prefill]
        figures["decode"] = [r.url for r in so.decode]
    else:
        figures["replicas"] = [r.url for r in so.replicas]
    try:
        with urllib.request.urlopen(so.router.metrics_url, timeout=5.0) as resp:
            text = resp.read(ROUTER_METRICS_MAX_BYTES).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        figures["error"] = f"cannot read {so.router.metrics_url}: {err}"
    else:
        figures.update(router_figures(plan, text))
        kept = "".join(
            line + "\n"
            for line in text.splitlines()
            if line and "_bucket{" not in line and not line.startswith("#")
        )
        write_atomic(result_dir / ROUTER_METRICS_TXT, kept[:ROUTER_METRICS_TXT_MAX_BYTES])
    write_router(result_dir, RouterRecord.from_figures(figures))
