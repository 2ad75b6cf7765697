"""The Slurm allocation a cell needs on its runner, printed as shell assignments for the launchers.

`python -m agentsweep.commands.allocation RUNNER` reads the cell from $AGENTSWEEP_CELL (validated here,
once, for the launcher) and the runner's site settings from configs/runners.yaml (or
$AGENTSWEEP_RUNNERS: partition, account, exclude, container runtime, HF cache, default time limit,
max_nodes), and prints `AS_NAME=value` lines, shell-quoted, for runners/lib/launch.sh to `eval`: those
settings, the cell's exp_name, image and GRES type, and the derived GPU count, time limit and memory.
A capacity cell's time limit is its job time limit, and AS_STEP_BUDGET says how many steps it holds.
A cell spanning several nodes (`cell.nodes`) also gets AS_NODES and AS_NODE_GPUS (the GPUs asked on
every node: the fullest node of the instances packed onto the cell's `gpus_per_node`, as the matrix
packs them); memory is then per node. AS_CELL_ON_HOST=1 says that the cell runs on the host side of its
node and only its engine instances in the container (a routed or multi-node cell under pyxis or
docker: `agentsweep.cell.placement.cell_on_host`). Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from agentsweep.cell.allocation import cell_time_limit_min, mem_gb
from agentsweep.cell.placement import cell_on_host, node_gpus
from agentsweep.cell.step_budget import step_budget
from agentsweep.config import load_runners
from agentsweep.contract.cell import CELL_ENV_VAR, Cell
from agentsweep.errors import AgentsweepError, ConfigError, InputError


def runner_assignments(
    runner: str, cell: Cell, env: Mapping[str, str], runners_path: Path | None
) -> dict[str, str]:
    """Every AS_* value the launcher library reads, as strings: the node's facts from the cell (the
    matrix resolved them), the site's Slurm and container settings from the runner's entry."""
    runners = load_runners(runners_path)
    if runner not in runners:
        where = runners_path or env.get("AGENTSWEEP_RUNNERS") or "configs/runners.yaml"
        raise ConfigError(f"{where}: no runner {runner!r} (known: {', '.join(sorted(runners)) or 'none'})")
    spec = runners[runner]
    if cell.runner != runner:
        raise InputError(f"cell.runner: {cell.runner!r} but this is the {runner!r} launcher")
    if not env.get("RESULT_DIR", "").strip():
        raise InputError("environment variable RESULT_DIR is not set (the launcher needs it)")
    per_node = cell.gpus
    dram_gb = cell.cpu_dram_gb
    if cell.nodes > 1:
        if cell.nodes > spec.max_nodes:
            raise InputError(
                f"cell.nodes: {cell.nodes} but runner {runner!r} allows max_nodes {spec.max_nodes}"
            )
        per_node = node_gpus(cell.instance_tps, cell.node.gpus_per_node)
        dram_gb = cell.cpu_dram_gb * per_node / cell.gpus
    return {
        "AS_RUNNER": runner,
        "AS_EXP_NAME": cell.exp_name,
        "AS_IMAGE": cell.image,
        "AS_IMAGE_PIN": cell.image_digest,
        "AS_TRACES": cell.traces,
        "AS_GPUS": str(cell.gpus),
        "AS_NODES": str(cell.nodes),
        "AS_NODE_GPUS": str(per_node),
        "AS_GPUS_PER_NODE": str(cell.node.gpus_per_node),
        "AS_GRES_TYPE": cell.node.gres_type,
        "AS_PARTITION": spec.partition or "",
        "AS_ACCOUNT": spec.account or "",
        "AS_EXCLUDE": ",".join(spec.exclude),
        "AS_CONTAINER_RUNTIME": spec.container_runtime,
        "AS_CELL_ON_HOST": "1" if cell_on_host(cell, spec.container_runtime) else "0",
        "AS_HF_CACHE": spec.hf_cache or "",
        "AS_TIME_LIMIT_MIN": str(cell_time_limit_min(cell, env, spec.time_limit_min)),
        "AS_MEM_GB": str(mem_gb(dram_gb, env)),
        # A capacity cell's steps within that time limit (shown by the launcher's dry run); "" otherwise.
        "AS_STEP_BUDGET": step_budget(cell, env).describe() if cell.capacity is not None else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentsweep.commands.allocation", description=__doc__)
    parser.add_argument("runner", help="key of configs/runners.yaml (h200, b200, mi355x, ...)")
    parser.add_argument(
        "--runners", type=Path, default=None, help="runners file (default: $AGENTSWEEP_RUNNERS)"
    )
    args = parser.parse_args(argv)
    try:
        raw = os.environ.get(CELL_ENV_VAR, "")
        if not raw.strip():
            raise InputError(f"environment variable {CELL_ENV_VAR} is not set (the matrix cell's JSON)")
        cell = Cell.parse(raw, where=f"${CELL_ENV_VAR}")
        values = runner_assignments(args.runner, cell, os.environ, args.runners)
    except AgentsweepError as err:
        print(err.render(), file=sys.stderr)
        return err.exit_code
    for name, value in values.items():
        print(f"{name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
