"""A simulated cell on the virtual clock (``clock: virtual``): its plan run in this process.

The plan is the HTTP path's, command lines included; ``agentsweep.virtual`` runs the same parts with
the same flags on one virtual clock, with no process and no socket, and writes the same result
directory. What follows the run (the checks, the verdict, cell.json) is the HTTP path's too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import agentsweep
from agentsweep.cell.effective import Stated, stated_settings
from agentsweep.cell.engines import recipe
from agentsweep.cell.plan import CellPlan
from agentsweep.cell.replicas import request_figures, router_identity
from agentsweep.contract.cell import IN_PROCESS_ROUTER
from agentsweep.contract.resultdir import ROUTER_METRICS_CSV, SERVER_METRICS_CSV, RouterRecord, write_router
from agentsweep.errors import InputError, ResultFileError
from agentsweep.metrics.scrapes import ScrapeReader, merge_metrics

if TYPE_CHECKING:
    from agentsweep.virtual.run import LocalOutcome, LocalRun

# agentsweep.virtual.run is imported where a run needs it: it brings the simulated engine and the
# replayer's HTTP client (a third of a second of imports), which a wall-clock cell's process, the dry
# run and `agentsweep matrix` never use.


def _flags(argv: list[str], subcommand: str, what: str) -> list[str]:
    """What follows ``subcommand`` in ``argv`` (a part's command line as the plan renders it)."""
    if subcommand not in argv:
        raise InputError(f"virtual clock: the {what} command {argv[:4]!r}... does not run {subcommand}")
    return argv[argv.index(subcommand) + 1 :]


def local_run(plan: CellPlan) -> LocalRun:
    """The plan's parts as the flags ``run_local`` takes; InputError for a plan it cannot run."""
    from agentsweep.virtual.run import LocalInstance, LocalRouter, LocalRun

    cell = plan.cell
    if plan.mode == "pd" or plan.client_argvs:
        raise InputError(
            f"cell {cell.exp_name}: clock: virtual runs one client against one engine or replicas behind a "
            "router; disaggregated roles and client_nodes > 1 need clock: wall"
        )
    rd = plan.result_dir
    instances = [
        LocalInstance(
            engine_flags=_flags(inst.engine.argv, "engine-sim", "engine"),
            server_log=rd / inst.log_name,
            metrics_flags=_flags(inst.scraper_argv, "metrics-collector", "metrics collector"),
            metrics_log=rd / inst.collector_log_name,
            name=inst.name,
            metrics_url=inst.url + inst.engine.metrics_path,
        )
        for inst in plan.instances
    ]
    router = None
    if plan.router is not None:
        router = LocalRouter(cell.router, rd / ROUTER_METRICS_CSV, plan.scrape_interval_s)
    return LocalRun(
        instances=instances,
        replay_flags=_flags(plan.replay_argv, "replay", "replay"),
        replay_log=rd / "replay.log",
        power_flags=_flags(plan.power_argv, "power-sampler", "power sampler") if plan.power_argv else None,
        router=router,
    )


def execute_in_process(
    plan: CellPlan,
    versions: dict[str, str | None],
    say: Callable[[str], None],
    stated: dict[str, Stated | None] | None = None,
) -> LocalOutcome:
    """Run ``plan`` on the virtual clock: why the run failed (None: it did not), and the stop signal
    that ended it early, if one did (the caller unwinds as the HTTP path's interrupt does). A routed
    cell's instances are merged into server_metrics.csv and its router's counts written to
    router.json, as the HTTP path does after the replay."""
    from agentsweep.virtual.run import run_local

    run = local_run(plan)
    rd = plan.result_dir
    rd.mkdir(parents=True, exist_ok=True)
    through = f" behind an in-process {plan.cell.router} router" if plan.router is not None else ""
    say(
        f"running in this process on a virtual clock: {plan.cell.users} users for {plan.cell.duration} s"
        + (f", {len(plan.instances)} engines{through}" if len(plan.instances) > 1 else "")
    )
    versions["engine"] = recipe(plan.cell.engine).version(plan.client.url)
    if plan.router is not None:  # as the HTTP path records its router program: "program version"
        versions["router"] = f"{IN_PROCESS_ROUTER} {agentsweep.__version__}"
    outcome = run_local(run, say)
    if stated is not None:  # its start-up lines, written as the run began
        stated["engine"] = stated_settings(plan.cell.engine, rd / plan.client.log_name)
    if plan.router is not None:
        merge_metrics([rd / r.metrics_name for r in plan.answering], rd / SERVER_METRICS_CSV)
        write_router(rd, in_process_router_record(plan, run))
    return outcome


def in_process_router_record(plan: CellPlan, run: LocalRun) -> RouterRecord:
    """router.json of a routed cell on the virtual clock: the in-process router's requests per
    replica, as its last row of router_metrics.csv holds them."""
    assert run.router is not None
    figures = router_identity(plan, IN_PROCESS_ROUTER, agentsweep.__version__, plan.cell.router)
    try:
        rows = list(ScrapeReader(run.router.output, figures=None))
    except ResultFileError:
        rows = []
    if not rows:
        figures["error"] = f"{ROUTER_METRICS_CSV}: no row"
        return RouterRecord.from_figures(figures)
    last = rows[-1].values
    by_url = {inst.url: float(last.get(f"requests.{inst.name}") or 0.0) for inst in plan.instances}
    figures.update(request_figures(plan, by_url))
    return RouterRecord.from_figures(figures)


class InProcessGroup:
    """What a capacity cell on the virtual clock has in place of its running engines: nothing runs
    between steps (each step's run starts its own engine, its prefix cache cold, as the HTTP path's
    reset leaves it), and what the engine stated is kept from the last step."""

    router = None

    def __init__(self) -> None:
        self.stated: dict[str, Stated | None] = {}
        self.log_names: list[str] = []  # each step's run writes its logs into the step's own directory

    def missing_router(self) -> str | None:
        return None

    def died_reason(self) -> str | None:
        return None

    def __enter__(self) -> InProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
