"""Run every preflight check for a config key (or one cell) and build the report.

What the cells need is taken from the cells themselves (the matrix's own output) and the runner's
entry in configs/runners.yaml: the largest cell's nodes and GPUs per node, the offload memory it asks
Slurm for (``agentsweep.cell.allocation.mem_gb``), the fixed ports its command lines name. The node
checks run on the nodes through one short Slurm job (``srun --immediate``: when no node is free at
once, they are skipped with that reason rather than waiting in the queue), or here for a runner
without Slurm.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentsweep.cell.allocation import mem_gb
from agentsweep.cell.engines import recipe
from agentsweep.cell.placement import node_gpus
from agentsweep.cell.step_budget import no_step_reason, step_budget
from agentsweep.config.schema import RunnerSpec
from agentsweep.contract.cell import Cell
from agentsweep.contract.hardware import is_amd
from agentsweep.preflight import container, hub
from agentsweep.preflight.accuracy import accuracy_checks
from agentsweep.preflight.node import NodeSpec, Run, _last, _run, node_checks
from agentsweep.preflight.report import Check, Report, failed, passed, skipped
from agentsweep.preflight.slurm import SlurmNeed, slurm_checks

LOCAL_LAUNCHER = "runners/launch_local.sh"
PROBE_TIME_MIN = 5
_PORT_FLAG = re.compile(r"^--[a-z0-9-]*port$")


def fixed_ports(cells: Sequence[Cell], environ: Mapping[str, str]) -> list[int]:
    """Ports the cells bind whatever is free: PORT, ``--...port N`` in engine/router args, ``*_PORT`` env."""
    ports: set[int] = set()
    if environ.get("PORT", "").strip().isdigit():
        ports.add(int(environ["PORT"]))
    for cell in cells:
        for text in (cell.engine_args, cell.router_args):
            words = shlex.split(text)
            for flag, value in zip(words, [*words[1:], ""], strict=False):
                key, _, inline = flag.partition("=")
                candidate = inline if inline else value
                if _PORT_FLAG.match(key) and candidate.isdigit():
                    ports.add(int(candidate))
        for name, value in cell.engine_env.items():
            if name.endswith("_PORT") and value.strip().isdigit():
                ports.add(int(value))
    return sorted(ports)


def node_spec(
    cells: Sequence[Cell], runner_key: str, runner: RunnerSpec, environ: Mapping[str, str]
) -> NodeSpec:
    per_node = max(node_gpus(c.instance_tps, runner.gpus_per_node) if c.nodes > 1 else c.gpus for c in cells)
    mem = 0
    for c in cells:
        per_node_dram = c.cpu_dram_gb * (
            node_gpus(c.instance_tps, runner.gpus_per_node) / c.gpus if c.nodes > 1 else 1
        )
        mem = max(mem, mem_gb(per_node_dram, environ))
    hardware = runner.hardware or ""
    return NodeSpec(
        runner=runner_key,
        vendor="amd" if is_amd(hardware) else "nvidia",
        hardware=hardware,
        gpus=max(per_node, 1) if not runner.gres_type else runner.gpus_per_node,
        mem_gb=mem,
        ports=fixed_ports(cells, environ),
        runtime=runner.container_runtime,
        simulated=all(recipe(c.engine).simulated for c in cells),
    )


def probe_nodes(spec: NodeSpec, need: SlurmNeed, wait_s: int, run: Run) -> list[Check]:
    """The node checks on ``need.nodes`` nodes of one short job (one task per node)."""
    argv = [
        "srun", f"--nodes={need.nodes}", "--ntasks-per-node=1", f"--time={PROBE_TIME_MIN}",
        f"--immediate={wait_s}", "--job-name=agentsweep-preflight", "--quiet",
    ]  # fmt: skip
    if need.partition:
        argv.append(f"--partition={need.partition}")
    if need.account:
        argv.append(f"--account={need.account}")
    if need.exclude:
        argv.append(f"--exclude={','.join(need.exclude)}")
    if need.node_gpus and not spec.simulated:
        argv.append(f"--gres=gpu:{need.gres_type + ':' if need.gres_type else ''}{need.node_gpus}")
    argv += [sys.executable, "-m", "agentsweep.preflight.node", "--spec", spec.to_json()]
    status, text = run(argv)
    checks: list[Check] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        checks += [Check.from_dict(c) for c in data.get("checks", [])]
    if checks:
        return sorted(checks, key=lambda c: (c.name, c.node))
    why = _last(text)
    if status != 0 and re.search(r"immediate|busy|[Uu]nable to allocate|not available now", text):
        return [
            skipped(
                "node", f"no {need.nodes} nodes free at once ({why}); the node checks run when nodes are idle"
            )
        ]
    return [
        failed(
            "node",
            f"the node probe (srun) failed with {status}: {why}",
            "run `srun -N1 hostname` with the runner's partition/account to see why",
        )
    ]


def capacity_checks(cells: Sequence[Cell], environ: Mapping[str, str]) -> list[Check]:
    """Each capacity cell's job time limit holds at least one search step (else it would start its
    engine and measure nothing)."""
    checks = []
    for cell in cells:
        if cell.capacity is None:
            continue
        reason = no_step_reason(cell, environ)
        if reason is None:
            checks.append(passed("capacity", f"{cell.exp_name}: {step_budget(cell, environ).describe()}"))
        else:
            checks.append(
                failed(
                    "capacity",
                    f"{cell.exp_name}: {reason}",
                    "raise the search's time_limit_min (users: {search: [...], time_limit_min: N}), or "
                    "shorten its duration",
                )
            )
    return checks


def run_preflight(
    subject: str,
    cells: Sequence[Cell],
    runner_key: str,
    runner: RunnerSpec,
    *,
    environ: Mapping[str, str],
    repo: Path,
    probe: bool = True,
    probe_wait_s: int = 60,
    run: Run = _run,
) -> Report:
    env = dict(environ)
    first = cells[0]
    engines = sorted({c.engine for c in cells})
    checks: list[Check] = [
        passed(
            "config",
            f"{len(cells)} cells on runner {runner_key} ({', '.join(engines)}, {first.model}, image {first.image or '-'})",
        )
    ]
    checks += capacity_checks(cells, env)
    slurm_runner = runner.launcher != LOCAL_LAUNCHER
    spec = node_spec(cells, runner_key, runner, env)
    need = SlurmNeed(
        runner=runner_key,
        partition=runner.partition,
        account=runner.account,
        gres_type=runner.gres_type,
        nodes=max(c.nodes for c in cells),
        node_gpus=spec.gpus if runner.gres_type else max(c.gpus for c in cells),
        exclude=tuple(runner.exclude),
    )
    if slurm_runner:
        checks += slurm_checks(need, run)
    else:
        checks.append(skipped("slurm", f"runner {runner_key} runs cells on this machine ({runner.launcher})"))
    checks.append(container.runtime_check(runner.container_runtime, runner_key, run))
    for image, pinned in sorted({(c.image, c.image_digest) for c in cells}):
        checks.append(container.image_check(image, runner.container_runtime, env, run, pinned))
    simulated = all(recipe(c.engine).simulated for c in cells)
    download = 0
    if simulated:
        checks.append(skipped("model", "the simulated engine loads no weights"))
    else:
        for model in sorted({c.model for c in cells}):
            check, need_bytes = hub.model_check(model, runner.hf_cache, env)
            checks.append(check)
            download += need_bytes
        checks.append(
            hub.disk_check(
                "disk.hf_cache", hub.cache_dir(runner.hf_cache, env), download, "the model downloads"
            )
        )
    checks += accuracy_checks(cells, runner.hf_cache, env, runner.container_runtime)
    checks.append(hub.disk_check("disk.results", hub.results_root(env), 0, "the result directories"))
    for traces in sorted({c.traces for c in cells}):
        check = hub.traces_check(traces, runner.hf_cache, env, repo)
        checks.append(check)
        # A cell's context cut may leave no request of them (max_context 1): the replayer then refuses.
        for cut in sorted(
            {c.replay.max_context for c in cells if c.traces == traces and c.replay.max_context}
        ):
            if check.status == "PASS":
                checks.append(hub.traces_fit_check(traces, cut, repo))
    if not slurm_runner:
        checks += node_checks(spec, None, run)
    elif not probe:
        checks.append(skipped("node", "--no-probe: GPUs, memory and ports of the nodes not checked"))
    elif any(c.status == "FAIL" for c in checks if c.name.startswith("slurm")):
        checks.append(skipped("node", "the Slurm checks failed: no node to probe"))
    else:
        checks += probe_nodes(spec, need, probe_wait_s, run)
    return Report(subject, checks)
