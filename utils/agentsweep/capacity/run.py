"""A capacity cell: start the engine(s) once, run measured steps at the user counts the search picks,
write capacity.json and one plain line per SLO tier.

Each step is a complete measured run, as an ordinary cell at one user count would make it, in
``steps/<n>/`` of the cell's result directory: the engine goes idle and its prefix cache is reset
(vLLM ``/reset_prefix_cache``, SGLang ``/flush_cache``), the collectors and the replayer run (warm-up,
measurement window), the full validity checks judge it, and the step gets its own cell.json,
status.txt (a step's cell is the capacity cell at that user count) and receipt.json. Before each
step the job's time limit must still hold it (``agentsweep.cell.step_budget.step_budget``), else the
search stops with "budget spent"; a time limit that holds no step fails the cell before the engine
starts. capacity.json is rewritten after every step (stop reason "interrupted" until the search
ends), so the finished steps always stand: SIGTERM writes it with "interrupted", an engine that dies
with "engine failed", a FAILED step (a replayer that died, say: nothing measured) with "step
failed"; the cell is then FAILED with the reason. A search resumed (``agentsweep sweep --resume``)
starts from the steps of its result directory that stand (``agentsweep.capacity.steps``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from agentsweep.capacity.engine_state import reset_prefix_cache, wait_idle
from agentsweep.capacity.power import step_power_w
from agentsweep.capacity.search import next_step, tier_results
from agentsweep.capacity.steps import leftovers, measured_steps, step_cell, step_record
from agentsweep.cell import record
from agentsweep.cell.accuracy_step import accuracy_check, run_accuracy_step
from agentsweep.cell.accuracy_step import check_ready as check_accuracy_ready
from agentsweep.cell.engine_process import EngineFailed, copy_log_section, log_size
from agentsweep.cell.engines import recipe
from agentsweep.cell.executor import EngineGroup, replay, show_tail
from agentsweep.cell.in_process import InProcessGroup
from agentsweep.cell.lifecycle import (
    cell_voice,
    check_outputs,
    execute_virtual,
    judge,
    run_cell,
    seal,
    start_versions,
)
from agentsweep.cell.plan import CellOptions, CellPlan
from agentsweep.cell.step_budget import StepBudget, step_budget
from agentsweep.cell.stop import CellInterrupted
from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import (
    SERVER_LOG,
    CapacityRecord,
    StepRecord,
    TierResult,
    step_dir,
    write_capacity,
)
from agentsweep.contract.resultdir.capacity import StopReason
from agentsweep.contract.slo import CapacitySpec
from agentsweep.contract.verdict import Verdict
from agentsweep.errors import InputError
from agentsweep.watchdog import Watchdog

# Seconds the engine may take to finish (or abort) what the last step left in flight, and to accept
# the prefix-cache reset.
SETTLE_TIMEOUT_S = 120.0
RESET_TIMEOUT_S = 60.0


class EngineDied(Exception):
    """An engine instance or the router exited during a step; the message is the reason."""


class StepFailed(Exception):
    """A step ended FAILED (its replayer died, its outputs are missing, the cache reset failed): it
    measured nothing, so the search cannot go on honestly. The message is the cell's reason."""


def describe(cell: Cell) -> list[str]:
    """Dry-run lines of a capacity cell: its search, its tiers and its step budget."""
    spec = cell.capacity
    assert spec is not None
    resolution = "whole users" if spec.resolution == 0 else f"{spec.resolution:.0%} of the lower count"
    lines = [
        f"capacity: search users {spec.low}..{spec.high} (bracket, then bisect to {resolution}), "
        f"{spec.repeats} run(s) per count, cliff factor {spec.cliff_factor:g}",
        "  each step: the collectors and the replayer above at that user count (--max-users N)"
        ", their files in RESULT_DIR/steps/<n>/, after the engine is idle and its "
        f"prefix cache reset (POST {recipe(cell.engine).cache_reset_path})",
        *(f"  tier {tier.describe()}" for tier in spec.tiers),
        f"  {step_budget(cell).describe()}",
    ]
    return lines


class CapacityRun:
    """The search of one capacity cell against its running engine group."""

    def __init__(
        self,
        plan: CellPlan,
        options: CellOptions,
        group: EngineGroup | InProcessGroup,
        budget: StepBudget,
        say: Callable[[str], None],
        watchdog: Watchdog | None,
        versions: dict[str, str | None],
    ) -> None:
        spec = plan.cell.capacity
        assert spec is not None
        self.spec: CapacitySpec = spec
        self.plan = plan
        self.options = options
        self.group = group
        self.budget = budget
        self.say = say
        self.watchdog = watchdog
        self.versions = versions
        self.steps: list[StepRecord] = []  # the steps so far (those a resumed search kept first)
        self.measured_here = 0  # steps this start of the engine measured
        self.started = time.monotonic()  # the cell's start: the job's time limit counts from about here
        self.engine_started: float | None = None  # engine-seconds: from the engines' start to their stop
        self.engine_stopped: float | None = None

    def run(self) -> StopReason | None:
        """Run steps until no tier needs another or the budget is spent; the stop reason when the
        search ended before resolving every tier, else None."""
        self.measured_here = 0
        while (step := next_step(self.spec, self.steps)) is not None:
            users, repeat = step
            longest = max((s.wall_s for s in self.steps), default=0.0)
            elapsed = time.monotonic() - self.started
            if not self.budget.fits(elapsed, longest):
                self.say(
                    f"budget spent: {elapsed:.0f} s used, a step takes about "
                    f"{max(longest, self.budget.step_s):.0f} s and the job's time limit is "
                    f"{self.budget.time_limit_s / 60:g} min"
                )
                return "budget spent"
            self._step(users, repeat)
            self.measured_here += 1
            self.write("interrupted")
        return None

    def _step(self, users: int, repeat: int) -> None:
        """Run, judge and record one step (appended to ``steps`` whatever happens, an interrupt too)."""
        index = len(self.steps)
        cell = step_cell(self.plan.cell, index, users)
        sdir = step_dir(self.plan.result_dir, index)
        sdir.mkdir(parents=True, exist_ok=True)
        plan = self.plan.for_step(cell, sdir)
        start, start_utc = time.monotonic(), record.utc_now()
        offsets = {name: log_size(self.plan.result_dir / name) for name in self.group.log_names}
        runs = f" (run {repeat + 1} of {self.spec.repeats})" if self.spec.repeats > 1 else ""
        self.say(f"step {index}: {users} users{runs}")
        status: Verdict = "FAILED"
        reasons: list[str] = ["the step did not finish"]
        died: str | None = None
        interrupted: CellInterrupted | None = None
        try:
            reason = self._replay(plan)
            died = self.group.died_reason()
            reason = reason or check_outputs(sdir)
            if reason is None:
                reasons = judge(plan, self.group.stated)
                status = "INVALID" if reasons else "SUCCESS"
            else:
                reasons = [reason]
        except CellInterrupted as err:
            reasons, interrupted = [str(err)], err
        finally:
            for name, offset in offsets.items():
                copy_log_section(self.plan.result_dir / name, sdir / name, offset)
            record.write_result(
                sdir,
                cell=cell.model_dump(mode="json"),
                engine_command=plan.engine.argv,
                engine_env=plan.engine.env,
                replay_command=plan.replay_argv,
                versions=self.versions,
                start_utc=start_utc,
                status=status,
                reasons=reasons,
                extra={"scaleout": plan.scaleout_record()} if plan.router is not None else None,
            )
            # A step is a result directory of its own: sealed with its receipt as soon as its verdict
            # is written (verify, ingest, export and --resume read it as any cell's).
            seal(sdir, cell, self.versions.get("engine"), self.say)
        step = step_record(
            self.plan.result_dir,
            self.spec,
            cell,
            index=index,
            repeat=repeat,
            status=status,
            reasons=reasons,
            wall_s=time.monotonic() - start,
            start_utc=start_utc,
            end_utc=record.utc_now(),
        )
        self.steps.append(step)
        self.say(f"step {index}: {users} users: {status}" + _figures_text(self.spec, step))
        if interrupted is not None:
            raise interrupted
        if died:
            raise EngineDied(died)
        if status == "FAILED":
            raise StepFailed(f"step {index} ({users} users) FAILED: {step.reasons[0]}")

    def _replay(self, plan: CellPlan) -> str | None:
        """One step's replay: against the running engines after ``_prepare``, or on the virtual clock
        a run of its own in this process."""
        if isinstance(self.group, InProcessGroup):
            return execute_virtual(plan, self.versions, self.say, self.group.stated)
        return self._prepare() or replay(plan, self.group, self.options, self.say, self.watchdog)

    def _prepare(self) -> str | None:
        """Idle engine, cold prefix cache; why the step cannot start cleanly, or None."""
        instances = self.plan.instances
        problem = wait_idle([i.url + i.engine.metrics_path for i in instances], SETTLE_TIMEOUT_S)
        if problem:
            return problem
        reset_path = recipe(self.plan.cell.engine).cache_reset_path
        for inst in instances:
            problem = reset_prefix_cache(inst.url + reset_path, RESET_TIMEOUT_S)
            if problem:
                return f"prefix cache reset failed: {problem}"
        return None

    def write(self, ended: StopReason | None) -> tuple[StopReason, list[TierResult]]:
        """capacity.json for the steps so far; ``ended``: how the search stopped, None when it ran out of
        counts to measure."""
        cell = self.plan.cell
        reason, tiers = tier_results(
            self.spec, self.steps, gpus=cell.gpus, ended=ended, power_w=self._power_at
        )
        write_capacity(
            self.plan.result_dir,
            CapacityRecord(
                exp_name=cell.exp_name,
                gpus=cell.gpus,
                low=self.spec.low,
                high=self.spec.high,
                resolution=self.spec.resolution,
                repeats=self.spec.repeats,
                cliff_factor=self.spec.cliff_factor,
                time_limit_s=float(self.budget.time_limit_s),
                step_budget=self.budget.steps,
                stop_reason=reason,
                engine_s=self.engine_seconds(),
                tiers=tuple(tiers),
                steps=tuple(self.steps),
            ),
        )
        return reason, tiers

    def engine_seconds(self) -> float:
        if self.engine_started is None:
            return 0.0
        return round((self.engine_stopped or time.monotonic()) - self.engine_started, 3)

    def _power_at(self, users: int) -> float | None:
        watts = [
            step_power_w(self.plan.result_dir / s.dir, self.plan.cell) for s in self.steps if s.users == users
        ]
        measured = [w for w in watts if w is not None]
        return math.fsum(measured) / len(measured) if measured else None


def _figures_text(spec: CapacitySpec, step: StepRecord) -> str:
    parts = []
    for constraint in spec.constraints:
        value = step.statistics.get(constraint.key)
        if value is not None:
            parts.append(f"{constraint.statistic_label} {constraint.format_value(value)}")
    text = f"; {', '.join(parts)}" if parts else ""
    if step.reasons and step.status != "SUCCESS":
        text += f" ({step.reasons[0]})"
    return text


def run_capacity_cell(
    plan: CellPlan, options: CellOptions, *, log: Callable[[str], None] | None = None
) -> tuple[str, str | None]:
    """Run the capacity cell ``plan``; returns (status, reason) after writing capacity.json, cell.json
    status.txt and receipt.json (on every exit path, as ``run_cell`` does for an ordinary cell)."""
    cell = plan.cell
    assert cell.capacity is not None, "run_capacity_cell needs a capacity cell"
    say = cell_voice(plan, log)
    plan.result_dir.mkdir(parents=True, exist_ok=True)
    start_utc = record.utc_now()
    versions = start_versions()
    budget = step_budget(cell)
    for line in describe(cell):
        say(line)
    status: Verdict = "FAILED"
    reasons: list[str] = ["the capacity search did not finish"]
    ended: StopReason | None = "interrupted"
    watchdog = Watchdog(plan.result_dir)
    group = (
        InProcessGroup() if cell.clock == "virtual" else EngineGroup(plan, options, versions, say, watchdog)
    )
    search = CapacityRun(plan, options, group, budget, say, watchdog, versions)
    search.steps, _why = measured_steps(cell, plan.result_dir)
    if search.steps:
        counts = ", ".join(str(s.users) for s in search.steps)
        say(f"resuming: {len(search.steps)} measured step(s) stand (users {counts}); not measured again")
    try:
        watchdog.start()
        if budget.steps == 0:
            raise NoStep(f"the job's time limit holds no step: {budget.describe()}")
        missing = group.missing_router()
        if missing:
            raise EngineDied(missing)
        search.engine_started = time.monotonic()
        with group:
            run_accuracy_step(cell, plan.base_url, plan.result_dir, say)
            ended = search.run()
        search.engine_stopped = time.monotonic()
        status, reasons = "SUCCESS", []
        accuracy, _block = accuracy_check(cell, plan.result_dir)
        if accuracy is not None and not accuracy.ok:
            status, reasons = "INVALID", [f"accuracy: {accuracy.reason}"]
        if ended == "budget spent" and not search.measured_here:
            status, reasons = "FAILED", ["budget spent before the first step: no step fits the time left"]
    except NoStep as err:
        ended, reasons = "budget spent", [str(err)]
    except CellInterrupted as err:
        ended, reasons = "interrupted", [str(err)]
    except StepFailed as err:
        ended, reasons = "step failed", [str(err)]
    except (EngineFailed, EngineDied) as err:
        ended, reasons = "engine failed", [str(err)]
        show_tail(plan.result_dir / SERVER_LOG, say)
    except Exception as err:  # a bug or an unexpected OS error: still leave a verdict
        ended, reasons = "engine failed", [f"{type(err).__name__}: {err}"]
        raise
    finally:
        watchdog.dismiss()
        if search.engine_started is not None and search.engine_stopped is None:
            search.engine_stopped = time.monotonic()
        try:
            stop, tiers = search.write(ended)
            say(f"capacity search stopped: {stop} after {len(search.steps)} step(s)")
            for tier in tiers:
                say(tier.line)
        finally:
            record.write_result(
                plan.result_dir,
                cell=cell.model_dump(mode="json"),
                engine_command=plan.engine.argv,
                engine_env=plan.engine.env,
                replay_command=[],
                versions=versions,
                start_utc=start_utc,
                status=status,
                reasons=reasons,
                extra=_extra(plan, group),
            )
            seal(plan.result_dir, cell, versions.get("engine"), say)
            say(status + (f": {'; '.join(reasons)}" if reasons else ""))
    return status, "; ".join(reasons) or None


class NoStep(Exception):
    """The job's time limit holds no step: the engine is not started."""


def check_startable(cell: Cell, result_dir: Path) -> None:
    """Before any engine starts, what would stop the cell later (InputError): the accuracy harness
    it needs, and for a capacity search the steps kept in ``result_dir``."""
    check_accuracy_ready(cell)
    if cell.capacity is not None:
        check_resumable(cell, result_dir)


def run_planned(plan: CellPlan, options: CellOptions) -> tuple[str, str | None]:
    """A planned cell to its verdict, (status, reason): its capacity search when it has one, else its
    one run (``agentsweep cell``, and a sweep's virtual-clock cells in the sweep's own process)."""
    if plan.cell.capacity is not None:
        return run_capacity_cell(plan, options)
    return run_cell(plan, options)


def check_resumable(cell: Cell, result_dir: Path) -> None:
    """InputError when ``result_dir/steps/`` holds anything but steps this search stands on (a step
    measured again must not land among another run's files); say which and how to go on."""
    kept, why = measured_steps(cell, result_dir)
    extra = leftovers(result_dir, len(kept))
    if extra:
        because = f" ({why})" if why else ""
        raise InputError(
            f"RESULT_DIR={result_dir}: {extra[0]} is not a finished step of this search{because}; use an "
            "empty directory, or `agentsweep sweep --resume`, which keeps the steps that stand"
        )


def _extra(plan: CellPlan, group: EngineGroup | InProcessGroup) -> dict[str, object] | None:
    """cell.json's extra sections: the scale-out record, what each instance stated it runs with."""
    extra: dict[str, object] = {}
    if plan.router is not None:
        extra["scaleout"] = plan.scaleout_record()
    if group.stated:
        extra["engine_settings"] = {k: v.to_record() if v else None for k, v in group.stated.items()}
    return extra or None
