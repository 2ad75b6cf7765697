"""What an exported row must say for InferenceX's ingest to take it as the point it is.

Their names, not their code (docs/export.md cites the file and commit each rule was read from):

- the model key (``infmax_model_prefix``): the keys their database knows, from a map of the models
  this project ships (a config entry's ``infmax_model_prefix`` overrides it);
- the hardware key: the part of ``hw`` before its first ``-`` must be a GPU of their registry;
- the point's identity in their store, ``ingest_key``: the configuration (hardware, framework, model,
  precision, topology), the concurrency, the offload mode and the recipe fingerprint. Two rows with one
  identity overwrite each other there, so an export never writes two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agentsweep.contract.cell import Cell
from agentsweep.contract.model_keys import model_prefix as model_key

# The GPU keys of InferenceX's hardware registry.
GPU_KEYS: frozenset[str] = frozenset(
    {"h100", "h200", "b200", "b300", "gb200", "gb300", "mi300x", "mi325x", "mi355x"}
)
SIMULATED_SUFFIX = "-sim"


def model_prefix(cell: Cell) -> str | None:
    """The cell's InferenceX model key: its config entry's, else the shipped map's (None: unmapped)."""
    return model_key(cell.model, cell.infmax_model_prefix)


def hardware(cell: Cell, hardware_of_sim: str) -> str:
    """``hw`` of the cell's rows: its hardware (the runner's name when it names none), with
    ``-sim`` after it for the simulated engine, which InferenceX reads as the same GPU but which says
    the figures are simulated (as the row's framework ``sim`` does)."""
    if cell.engine == "sim":
        return f"{cell.node.hardware or hardware_of_sim}{SIMULATED_SUFFIX}"
    return cell.node.hardware or cell.runner


def gpu_key(hw: str) -> str | None:
    """The GPU key InferenceX reads from ``hw`` (after a ``cluster:`` scope, before the first ``-``)."""
    base = hw.lower().rsplit(":", 1)[-1].split("-", 1)[0]
    return base if base in GPU_KEYS else None


def unmapped(row: Mapping[str, Any]) -> list[str]:
    """What keeps InferenceX from placing a row, one line per field to set; empty when it maps."""
    out = []
    if not row.get("infmax_model_prefix"):
        out.append(
            f"model {row.get('model')!r} has no InferenceX model key: set infmax_model_prefix in its config "
            "entry (or pass --allow-unmapped)"
        )
    if gpu_key(str(row.get("hw", ""))) is None:
        out.append(
            f"hw {row.get('hw')!r} is no GPU of InferenceX's registry ({', '.join(sorted(GPU_KEYS))}): "
            "give the runner a hardware in configs/runners.yaml (or pass --allow-unmapped)"
        )
    return out


ROLE_FIELDS = (
    "prefill_tp",
    "prefill_ep",
    "prefill_num_workers",
    "decode_tp",
    "decode_ep",
    "decode_num_workers",
)


def ingest_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """A row's identity in InferenceX's store (two rows with one identity overwrite each other)."""
    roles = tuple(row.get(name) for name in ROLE_FIELDS)
    return (
        gpu_key(str(row.get("hw", ""))),
        str(row.get("framework", "")).lower(),
        row.get("infmax_model_prefix"),
        str(row.get("precision", "")).lower(),
        row.get("tp"),
        row.get("ep"),
        row.get("num_gpus"),
        bool(row.get("disagg")),
        roles,
        row.get("conc"),
        row.get("offload_mode"),
        row.get("recipe_fingerprint"),
    )


def colliding(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Pairs of rows InferenceX would store as one point, one line each (empty: none)."""
    seen: dict[tuple[Any, ...], str] = {}
    out = []
    for row in rows:
        key = ingest_key(row)
        name = str(row.get("exp_name"))
        if key in seen:
            out.append(
                f"{seen[key]} and {name} are one point to InferenceX (same configuration, users, offload "
                "mode and recipe fingerprint)"
            )
        else:
            seen[key] = name
    return out
