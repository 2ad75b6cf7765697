"""A simulated cell on the virtual clock (``clock: virtual``): its plan run in this process.

The plan is the HTTP path's, command lines included; ``agentsweep.virtual`` runs the same parts with
the same flags on one virtual clock, with no process and no socket, and writes the same result
directory. What follows the run (the checks, the verdict, cell.json) is the HTTP path's too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agentsweep.cell.effective import Stated, stated_settings
from agentsweep.cell.engines import recipe
from agentsweep.cell.plan import CellPlan
from agentsweep.errors import InputError

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
    from agentsweep.virtual.run import LocalRun

    cell = plan.cell
    if len(plan.instances) != 1 or plan.router is not None or plan.client_argvs:
        raise InputError(
            f"cell {cell.exp_name}: clock: virtual runs one engine and one client; replicas, routers, "
            "disaggregated roles and client_nodes > 1 need clock: wall"
        )
    inst = plan.instances[0]
    rd = plan.result_dir
    return LocalRun(
        engine_flags=_flags(inst.engine.argv, "engine-sim", "engine"),
        server_log=rd / inst.log_name,
        metrics_flags=_flags(inst.scraper_argv, "metrics-collector", "metrics collector"),
        replay_flags=_flags(plan.replay_argv, "replay", "replay"),
        replay_log=rd / "replay.log",
        power_flags=_flags(plan.power_argv, "power-sampler", "power sampler") if plan.power_argv else None,
        metrics_log=rd / inst.collector_log_name,
    )


def execute_in_process(
    plan: CellPlan,
    versions: dict[str, str | None],
    say: Callable[[str], None],
    stated: dict[str, Stated | None] | None = None,
) -> LocalOutcome:
    """Run ``plan`` on the virtual clock: why the run failed (None: it did not), and the stop signal
    that ended it early, if one did (the caller unwinds as the HTTP path's interrupt does)."""
    from agentsweep.virtual.run import run_local

    run = local_run(plan)
    plan.result_dir.mkdir(parents=True, exist_ok=True)
    say(f"running in this process on a virtual clock: {plan.cell.users} users for {plan.cell.duration} s")
    versions["engine"] = recipe(plan.cell.engine).version(plan.client.url)
    outcome = run_local(run, say)
    if stated is not None:  # its start-up lines, written as the run began
        stated["engine"] = stated_settings(plan.cell.engine, run.server_log)
    return outcome


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
