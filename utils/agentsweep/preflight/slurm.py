"""Slurm checks: the runner's partition, account, GRES type and enough nodes exist (sinfo, scontrol).

Each check reads what Slurm's own client commands print (``sinfo -h -a -o``, ``scontrol show config``,
``scontrol show partition -o``, ``sacctmgr -nP``) and compares it with the runner's entry in
configs/runners.yaml and what the key's cells ask for (nodes, GPUs per node).
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Sequence
from dataclasses import dataclass

from agentsweep.preflight.node import Run, _last
from agentsweep.preflight.report import Check, failed, passed, skipped

# Node states (sinfo %T, lower case, suffix flags like '*' or '~' stripped) a cell cannot be given.
UNUSABLE_STATES = (
    "down",
    "drain",
    "drained",
    "draining",
    "fail",
    "failing",
    "maint",
    "inval",
    "future",
    "reboot",
    "unknown",
    "power_down",
    "powered_down",
    "not_responding",
)
_GRES_ITEM = re.compile(r"^gpu(?::([^:(]+))?:(\d+)")


@dataclass(frozen=True)
class SlurmNeed:
    """What the key's cells ask of Slurm."""

    runner: str
    partition: str | None
    account: str | None
    gres_type: str | None
    nodes: int  # the most nodes one cell spans
    node_gpus: int  # the most GPUs one cell asks on a node
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeRow:
    name: str
    partition: str
    state: str
    gres: dict[str, int]  # GRES type ('' = untyped) -> GPUs


def parse_gres(text: str) -> dict[str, int]:
    """``gpu:h200:8(S:0-1),gpu:b200:8`` -> {'h200': 8, 'b200': 8}; an untyped ``gpu:4`` is ''."""
    out: dict[str, int] = {}
    for item in re.split(r",(?=gpu)", text.strip()):
        m = _GRES_ITEM.match(item.strip())
        if m:
            kind = m.group(1) or ""
            out[kind] = out.get(kind, 0) + int(m.group(2))
    return out


def parse_sinfo_nodes(text: str) -> list[NodeRow]:
    """Rows of ``sinfo -h -a -N -o '%N|%R|%T|%G'``."""
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        name, partition, state, gres = parts
        rows.append(
            NodeRow(name, partition.rstrip("*"), state.lower().rstrip("*~#!%$@^-+"), parse_gres(gres))
        )
    return rows


def _sinfo_nodes(run: Run) -> tuple[list[NodeRow] | None, str]:
    status, text = run(["sinfo", "-h", "-a", "-N", "-o", "%N|%R|%T|%G"])
    if status != 0:
        return None, _last(text)
    return parse_sinfo_nodes(text), ""


def slurm_checks(need: SlurmNeed, run: Run) -> list[Check]:
    """Partition, account, GRES type and node count, in that order (later ones skip when sinfo fails)."""
    rows, why = _sinfo_nodes(run)
    names = ("slurm.partition", "slurm.account", "slurm.gres", "slurm.nodes")
    if rows is None:
        fix = "run preflight where Slurm's client commands reach the cluster (the runner's host), with SLURM_CONF set if needed"
        return [failed(names[0], f"sinfo failed ({why})", fix)] + [
            skipped(n, "sinfo failed") for n in names[1:]
        ]
    where = f"runner {need.runner} in configs/runners.yaml"
    partitions = sorted({r.partition for r in rows})
    if need.partition and need.partition not in partitions:
        return [
            failed(
                names[0],
                f"no partition {need.partition!r} (there: {', '.join(partitions) or 'none'})",
                f"set partition of {where} to one of them",
            ),
            *(skipped(n, "the partition does not exist") for n in names[1:]),
        ]
    part_rows = [r for r in rows if r.partition == need.partition] if need.partition else rows
    label = need.partition or "the default partition"
    checks = [passed(names[0], f"partition {label} has {len({r.name for r in part_rows})} nodes")]
    checks.append(_account_check(need, run))
    typed = need.gres_type or ""
    offered = sorted({k or "(untyped)" for r in part_rows for k in r.gres})
    with_type = [r for r in part_rows if r.gres.get(typed, 0) > 0]
    if not with_type:
        gres = f"gpu:{typed}" if typed else "an untyped gpu"
        checks.append(
            failed(
                "slurm.gres",
                f"no node of {label} offers GRES {gres} (there: {', '.join(offered) or 'no GPUs'})",
                f"set gres_type of {where} to the type in the cluster's gres.conf",
            )
        )
        checks.append(skipped("slurm.nodes", "no node has the GRES type"))
        return checks
    checks.append(passed("slurm.gres", f"{len(with_type)} nodes of {label} offer gpu:{typed or '(untyped)'}"))
    usable = [
        r
        for r in with_type
        if r.name not in need.exclude and r.state not in UNUSABLE_STATES and r.gres[typed] >= need.node_gpus
    ]
    if len(usable) < need.nodes:
        states = ", ".join(f"{r.name} {r.state} {r.gres[typed]} GPUs" for r in with_type[:8])
        checks.append(
            failed(
                "slurm.nodes",
                f"{len(usable)} usable nodes with {need.node_gpus} gpu:{typed or '(untyped)'} in {label}, the largest cell spans {need.nodes} ({states})",
                f"lower max_nodes of {where} or the cells' size, or use a partition with more such nodes",
            )
        )
    else:
        checks.append(
            passed(
                "slurm.nodes",
                f"{len(usable)} usable nodes with {need.node_gpus} gpu:{typed or '(untyped)'}; the largest cell spans {need.nodes}",
            )
        )
    return checks


def _field(text: str, name: str) -> str:
    m = re.search(rf"(?:^|\s){name}\s*=\s*(\S+)", text, re.MULTILINE)
    return m.group(1) if m else ""


def _account_check(need: SlurmNeed, run: Run) -> Check:
    name = "slurm.account"
    if not need.account:
        return skipped(name, f"runner {need.runner} sets no account (Slurm uses your default)")
    where = f"account of runner {need.runner} in configs/runners.yaml"
    if need.partition:
        status, text = run(["scontrol", "show", "partition", "-o", need.partition])
        allowed = _field(text, "AllowAccounts") if status == 0 else ""
        denied = _field(text, "DenyAccounts") if status == 0 else ""
        if allowed and allowed != "ALL" and need.account not in allowed.split(","):
            return failed(
                name,
                f"partition {need.partition} allows accounts {allowed}, not {need.account!r}",
                f"set {where} to one of them",
            )
        if denied and need.account in denied.split(","):
            return failed(
                name, f"partition {need.partition} denies account {need.account!r}", f"set {where} to another"
            )
    status, text = run(["scontrol", "show", "config"])
    storage = _field(text, "AccountingStorageType") if status == 0 else ""
    if not storage or storage.endswith("/none"):
        return skipped(
            name,
            f"accounting is off on this cluster (AccountingStorageType={storage or '?'}): Slurm accepts any account",
        )
    user = getpass.getuser()
    status, text = run(
        [
            "sacctmgr",
            "-nP",
            "show",
            "assoc",
            f"where user={user}",
            f"account={need.account}",
            "format=account",
        ]
    )
    if status != 0:
        return failed(
            name,
            f"sacctmgr failed ({_last(text)})",
            "check the account by hand: sacctmgr show assoc user=$USER",
        )
    if need.account not in text.split():
        return failed(
            name,
            f"user {user} has no association with account {need.account!r}",
            f"set {where} to one of `sacctmgr show assoc user={user} format=account`",
        )
    return passed(name, f"user {user} may charge account {need.account}")


def has_slurm(run: Run) -> bool:
    return run(["sinfo", "--version"])[0] == 0


__all__: Sequence[str] = (
    "NodeRow",
    "SlurmNeed",
    "has_slurm",
    "parse_gres",
    "parse_sinfo_nodes",
    "slurm_checks",
)
