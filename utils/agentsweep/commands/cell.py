"""`agentsweep cell`: run one matrix cell (``--cell JSON|@FILE``, else $AGENTSWEEP_CELL) into $RESULT_DIR.

A capacity cell (one with ``capacity``) runs its search instead: one engine start, measured steps in
``steps/<n>/``, capacity.json (``agentsweep.capacity.run``).

Exit status: 0 SUCCESS, 1 INVALID or FAILED (status.txt says why), 2 bad input (one line naming the field).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from agentsweep.capacity.run import check_startable, run_planned
from agentsweep.cell import record
from agentsweep.cell.lifecycle import check_result_dir, record_refusal
from agentsweep.cell.placement import from_environ
from agentsweep.cell.plan import CellOptions, plan_cell
from agentsweep.cell.port_allocation import DryRunPortAllocator, FreePortAllocator, PortAllocator
from agentsweep.cell.stop import install_signal_handlers
from agentsweep.contract.cell import CELL_ENV_VAR, Cell
from agentsweep.errors import AgentsweepError, InputError
from agentsweep.images.local import refuse_other_image
from agentsweep.watchdog import set_parent_death_signal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        f"The cell is one JSON object (an item of `agentsweep matrix --json`), from --cell or ${CELL_ENV_VAR}. "
        "It carries its runner's facts (hardware, GRES type, node size, KV links). "
        "Also read from the environment: RESULT_DIR and optional PORT."
    )
    parser.add_argument("--cell", metavar="JSON|@FILE", help=f"the matrix cell (default: ${CELL_ENV_VAR})")
    parser.add_argument("--result-dir", type=Path, help="result directory (default: $RESULT_DIR)")
    parser.add_argument(
        "--health-timeout", type=float, help="seconds to wait for the engine (sim 120, real 1800)"
    )
    parser.add_argument("--stop-grace", type=float, help="seconds between SIGTERM and SIGKILL for the engine")
    parser.add_argument(
        "--replay-timeout", type=float, help="seconds the replayer may run (2 x duration + 600)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the resolved commands and exit")
    parser.add_argument(
        "--check", action="store_true", help="validate the cell, print its exp_name and exit (no RESULT_DIR)"
    )
    parser.add_argument(
        "--add-mask",
        action="store_true",
        help="print a GitHub Actions ::add-mask:: line for every secret value in the cell and exit",
    )


def run(args: argparse.Namespace) -> int:
    env = os.environ
    if args.check:
        print(_cell(args.cell, env).exp_name)
        return 0
    if args.add_mask:
        for value in cell_secrets(_cell(args.cell, env)):
            print(f"::add-mask::{value}")
        return 0
    result_text = str(args.result_dir) if args.result_dir else env.get("RESULT_DIR", "")
    if not result_text.strip():
        raise InputError("environment variable RESULT_DIR is required (the directory this cell fills)")
    result_dir = Path(result_text).resolve()
    if not args.dry_run:
        check_result_dir(result_dir)
    try:
        cell = _cell(args.cell, env)
        refuse_other_image(cell.image, cell.image_digest, env)
        placement = from_environ(cell, env)  # the Slurm job's nodes, when the cell spans several
        plan = plan_cell(cell, result_dir, ports=_ports(env, args.dry_run), placement=placement)
        if not args.dry_run:
            check_startable(cell, result_dir)
    except AgentsweepError as err:
        if not args.dry_run:
            _record_refusal(result_dir, args, err)
        raise
    if args.dry_run:
        print("\n".join(plan.describe()))
        if cell.capacity is not None:
            from agentsweep.capacity.run import describe

            print("\n".join(describe(cell)))
        return 0
    options = CellOptions(
        health_timeout_s=args.health_timeout,
        engine_stop_grace_s=args.stop_grace,
        replay_timeout_s=args.replay_timeout,
    )
    restore = install_signal_handlers()
    # Whoever started the cell (run_cell.sh, a launcher, a sweep) dying stops the cell cleanly too.
    set_parent_death_signal()
    try:
        status, _reason = run_planned(plan, options)
    finally:
        restore()
    return 0 if status == "SUCCESS" else 1


def cell_secrets(cell: Cell) -> list[str]:
    """Values in the cell to hide from logs: secret-named engine_env values and token-shaped strings."""
    values = sorted(record.secret_values(cell.engine_env))
    values += record.token_values(cell.to_json())
    return [v for v in dict.fromkeys(values) if "\n" not in v and "\r" not in v]


def _cell(arg: str | None, env: os._Environ[str]) -> Cell:
    if arg:
        return Cell.load(arg)
    raw = env.get(CELL_ENV_VAR, "")
    if not raw.strip():
        raise InputError(f"no cell: pass --cell JSON|@FILE or set ${CELL_ENV_VAR} to the matrix cell's JSON")
    return Cell.parse(raw, where=f"${CELL_ENV_VAR}")


def _ports(env: os._Environ[str], dry_run: bool) -> PortAllocator:
    """The cell's ports: $PORT (else a free one) and free ones, or a dry run's placeholders ($PORT
    when it is unset)."""
    raw = env.get("PORT", "").strip()
    if raw and (not raw.isdigit() or not 0 < int(raw) < 65536):
        raise InputError(f"environment variable PORT={raw!r}: expected a TCP port number 1-65535")
    port = int(raw) if raw else None
    if dry_run:
        return DryRunPortAllocator() if port is None else DryRunPortAllocator(cell_port=port)
    return FreePortAllocator(cell_port=port)


def _record_refusal(result_dir: Path, args: argparse.Namespace, err: AgentsweepError) -> None:
    """A cell refused for bad input still leaves a FAILED verdict, and its receipt, when its result dir
    is usable (the cell as much of it as can be read)."""
    record_refusal(result_dir, _raw_cell(args.cell or os.environ.get(CELL_ENV_VAR, "")), err.render())


def _raw_cell(text: str) -> dict[str, object]:
    """As much of a refused cell as can be read, for its cell.json (never raises)."""
    try:
        if text.startswith("@"):
            text = Path(text[1:]).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
