"""Which GPUs a cell's power sampler reads, and where: exactly the cell's GPUs, on every node of the cell.

- A simulated engine is its own GPU: every instance's /metrics serves its tensor-parallel GPUs in the
  DCGM exporter's names (``<instance>/<gpu>`` in power.csv when the cell has several instances), with
  any power source but ``none``. So is a dcgm runner whose ``power_endpoint`` is ``engine``.
- One node (no placement): the GPUs the cell computes for its instances (``plan.device_slices``; for a
  cell's one engine, the first ``gpus`` of CUDA_VISIBLE_DEVICES, or of ROCR_VISIBLE_DEVICES on AMD,
  else 0..gpus-1), read here.
- Several nodes of a Slurm allocation: on each node a job step holding the node's share of the job's
  GPUs keeps the cell's ones (the first ones, as instances are packed from position 0 on each node)
  and names them on a first line; nvidia-smi and amd-smi run in that step, a DCGM endpoint is read from
  here at the node's address.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agentsweep.cell.placement import Placement
from agentsweep.contract.cell import ENGINE_POWER_ENDPOINT, Cell
from agentsweep.contract.hardware import is_amd
from agentsweep.energy.spec import DEFAULT_DCGM_ENDPOINT, PowerTarget, SamplerSpec


def sampler_spec(
    cell: Cell,
    instances: Sequence[tuple[str, str, int, str]],
    slices: Sequence[Mapping[str, str]],
    placement: Placement | None,
    environ: Mapping[str, str],
    *,
    simulated: bool,
    local_node: str,
) -> SamplerSpec | None:
    """The sampler of ``cell`` (None when its runner samples no power).

    ``instances``: (name, node, tp, metrics URL) of every engine instance in start order; ``slices``:
    each one's device environment (``device_slices``).
    """
    source = cell.node.power_source
    if source == "none":
        return None
    interval = cell.node.power_interval_s
    if simulated or (source == "dcgm" and cell.node.power_endpoint == ENGINE_POWER_ENDPOINT):
        several = len(instances) > 1
        targets = tuple(
            PowerTarget(
                node=node,
                count=tp,
                gpus=tuple(str(i) for i in range(tp)),
                label=(name or "engine") if several else "",
                endpoint=url,
            )
            for name, node, tp, url in instances
        )
        return SamplerSpec(source="dcgm", interval_s=interval, targets=targets)
    endpoint = cell.node.power_endpoint or DEFAULT_DCGM_ENDPOINT
    if placement is None:
        ids = _local_ids(cell, slices, environ)
        url = endpoint.format(address="localhost") if source == "dcgm" else ""
        target = PowerTarget(node=local_node, count=len(ids), gpus=ids, endpoint=url)
        return SamplerSpec(source=source, interval_s=interval, targets=(target,))
    per_node: dict[str, int] = {}
    for slot in placement.slots:
        per_node[slot.node] = per_node.get(slot.node, 0) + slot.tp
    targets = tuple(
        PowerTarget(
            node=node,
            count=count,
            endpoint=endpoint.format(address=placement.addresses[node]) if source == "dcgm" else "",
            prefix=tuple(placement.node_step_prefix(node, count)),
        )
        for node, count in per_node.items()
    )
    return SamplerSpec(source=source, interval_s=interval, targets=targets)


def _local_ids(
    cell: Cell, slices: Sequence[Mapping[str, str]], environ: Mapping[str, str]
) -> tuple[str, ...]:
    """The cell's GPU ids on this node, as nvidia-smi (-i), amd-smi (-g) and DCGM (gpu) name them."""
    amd = is_amd(cell.node.hardware)
    visible = environ.get("ROCR_VISIBLE_DEVICES" if amd else "CUDA_VISIBLE_DEVICES", "").strip()
    allocated = [d.strip() for d in visible.split(",") if d.strip()] or [str(i) for i in range(cell.gpus)]
    ids: list[str] = []
    for devices in slices:
        for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
            if var in devices:
                given = [d for d in devices[var].split(",") if d]
                # HIP indices count inside what ROCR_VISIBLE_DEVICES shows.
                ids += [
                    allocated[int(d)] if amd and d.isdigit() and int(d) < len(allocated) else d for d in given
                ]
    return tuple(ids) if ids else tuple(allocated[: cell.gpus])
