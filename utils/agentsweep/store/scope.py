"""A point's scope (the curve it lies on) and its identity within the scope.

Scope: model, hardware (what the cell ran on, "simulated B300" or "B200"; "runner <key>" where
a real engine's runner states no hardware), engine, engine version, precision, offload mode, router
policy, scale-out shape, replayer version. Within a scope the points of one run form a curve over
tp, ep, users and gpus. Across runs, a point is "the same measurement again" when everything but the
versions matches (``identity``): that is what history follows and diff pairs.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from agentsweep.errors import InputError

SCOPE_FIELDS: tuple[str, ...] = (
    "model",
    "hardware",
    "engine",
    "engine_version",
    "precision",
    "offload",
    "router",
    "shape",
    "replayer_version",
)
POSITION_FIELDS: tuple[str, ...] = ("tp", "ep", "users", "gpus")
# What may change between two runs of the same measurement (and is shown, not matched on).
VERSION_FIELDS: tuple[str, ...] = ("engine_version", "replayer_version")
IDENTITY_FIELDS: tuple[str, ...] = (
    *(f for f in SCOPE_FIELDS if f not in VERSION_FIELDS),
    "config_key",
    *POSITION_FIELDS,
)
FILTER_FIELDS: tuple[str, ...] = (*SCOPE_FIELDS, "config_key", *POSITION_FIELDS)


def scope_key(values: Mapping[str, object]) -> str:
    """The scope as one readable string, ``model=...;hardware=...;...`` (fixed order)."""
    return ";".join(f"{name}={values.get(name) or ''}" for name in SCOPE_FIELDS)


def identity(values: Mapping[str, object]) -> tuple[str, ...]:
    """What pairs a point with its repeats in other runs."""
    return tuple(str(values.get(name) if values.get(name) is not None else "") for name in IDENTITY_FIELDS)


def parse_filter(texts: Iterable[str] | None, option: str = "--scope") -> dict[str, str]:
    """``model=X,offload=on`` (repeatable) as {field: value}; unknown fields are refused by name."""
    out: dict[str, str] = {}
    for text in texts or []:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep:
                raise InputError(f"{option} {part!r}: expected FIELD=VALUE")
            if name not in FILTER_FIELDS:
                close = difflib.get_close_matches(name, FILTER_FIELDS, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise InputError(
                    f"{option} {part!r}: no field {name!r}{hint}; fields: {', '.join(FILTER_FIELDS)}"
                )
            out[name] = value.strip()
    return out
