"""The matrix cell as the cell runner sees it: read from the environment, typed and checked once.

The launcher exports every matrix cell field as an environment variable named after the field in
upper case (``EXP_NAME``, ``CPU_DRAM_GB``...). A wrong value is an ``InputError`` naming the variable.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentsweep.errors import InputError

ENGINES = ("vllm", "sglang", "sim")
OFFLOAD_MODES = ("on", "off", "noprefix")
CONNECTORS = ("native", "simple")
TIMING_STRATEGIES = ("think-only", "original", "api-scaled")
APIS = ("chat", "completions")
CLIENTS = ("replay", "aiperf")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class CellSpec:
    """One matrix cell (ARCHITECTURE.md §2 and the team contract). ``None`` = not given: replayer default."""

    exp_name: str
    engine: str
    model: str
    tp: int
    users: int
    offload: str
    duration: int
    traces: str
    config_key: str = ""
    runner: str = "local"
    precision: str = ""
    image: str = ""
    ep: int = 1
    gpus: int = 0  # 0 = same as tp (filled in by from_env)
    cpu_dram_gb: float = 0.0
    offload_connector: str = "native"
    max_context: int | None = None
    max_delay: float | None = None
    advance_min: float | None = None
    advance_max: float | None = None
    timing_strategy: str | None = None
    ignore_eos: bool = False
    seed: int | None = None
    warmup_requests: int | None = None
    api: str = "chat"
    speed: float = 1.0
    engine_args: str = ""
    engine_env: str = "{}"
    client: str = "replay"

    @property
    def engine_env_dict(self) -> dict[str, str]:
        """ENGINE_ENV parsed (validated in from_env, so this cannot fail afterwards)."""
        return {str(k): str(v) for k, v in json.loads(self.engine_env or "{}").items()}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_env(self) -> dict[str, str]:
        """The environment a launcher exports for this cell (inverse of from_env)."""
        return cell_dict_to_env(self.to_dict())

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CellSpec:
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            var = field.name.upper()
            raw = env.get(var)
            required = field.default is dataclasses.MISSING
            if raw is None or (raw.strip() == "" and not _is_str_field(field)):
                if required:
                    raise InputError(
                        f"environment variable {var} is required (the matrix cell's '{field.name}')"
                    )
                continue
            values[field.name] = _convert(var, field, raw)
        spec = cls(**values)
        if spec.gpus == 0:
            spec = dataclasses.replace(spec, gpus=spec.tp)
        spec.check()
        return spec

    def check(self) -> None:
        """Cross-field checks; each failure names the variable."""
        _choice("ENGINE", self.engine, ENGINES)
        _choice("OFFLOAD", self.offload, OFFLOAD_MODES)
        _choice("OFFLOAD_CONNECTOR", self.offload_connector, CONNECTORS)
        _choice("API", self.api, APIS)
        _choice("CLIENT", self.client, CLIENTS)
        if self.timing_strategy is not None:
            _choice("TIMING_STRATEGY", self.timing_strategy, TIMING_STRATEGIES)
        if not _SAFE_NAME.match(self.exp_name):
            raise InputError(f"environment variable EXP_NAME={self.exp_name!r}: use only [A-Za-z0-9._-]")
        for var, value, low in (
            ("TP", self.tp, 1),
            ("EP", self.ep, 1),
            ("GPUS", self.gpus, 1),
            ("USERS", self.users, 1),
            ("DURATION", self.duration, 1),
        ):
            if value < low:
                raise InputError(f"environment variable {var}={value}: must be >= {low}")
        if not self.model.strip():
            raise InputError("environment variable MODEL is empty")
        if not self.traces.strip():
            raise InputError("environment variable TRACES is empty")
        if not self.speed > 0:
            raise InputError(f"environment variable SPEED={self.speed}: must be > 0")
        if self.engine != "sim" and self.speed != 1:
            raise InputError(
                f"environment variable SPEED={self.speed}: only the sim engine runs faster than real time"
            )
        if self.cpu_dram_gb < 0:
            raise InputError(f"environment variable CPU_DRAM_GB={self.cpu_dram_gb}: must be >= 0")
        try:
            env = json.loads(self.engine_env or "{}")
        except json.JSONDecodeError as err:
            raise InputError(f"environment variable ENGINE_ENV: not valid JSON ({err.msg})") from None
        if not isinstance(env, dict):
            raise InputError("environment variable ENGINE_ENV: must be a JSON object of NAME: value")


def cell_dict_to_env(cell: Mapping[str, Any]) -> dict[str, str]:
    """Flat cell dict -> environment (field names upper-cased; booleans as true/false; None left out)."""
    out: dict[str, str] = {}
    for key, value in cell.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, dict | list):
            text = json.dumps(value)
        else:
            text = str(value)
        out[key.upper()] = text
    return out


def _is_str_field(field: dataclasses.Field[Any]) -> bool:
    return field.type in ("str", str)


def _choice(var: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InputError(f"environment variable {var}={value!r}: expected one of {', '.join(allowed)}")


def _convert(var: str, field: dataclasses.Field[Any], raw: str) -> Any:
    kind = str(field.type).replace(" | None", "")
    text = raw.strip()
    if kind == "str":
        return raw
    if kind == "bool":
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise InputError(f"environment variable {var}={raw!r}: expected true or false")
    if kind == "int":
        try:
            number = float(text)
        except ValueError:
            raise InputError(f"environment variable {var}={raw!r}: expected an integer") from None
        if not number.is_integer():
            raise InputError(f"environment variable {var}={raw!r}: expected an integer")
        return int(number)
    if kind == "float":
        try:
            number = float(text)
        except ValueError:
            raise InputError(f"environment variable {var}={raw!r}: expected a number") from None
        if not math.isfinite(number):
            raise InputError(f"environment variable {var}={raw!r}: expected a finite number")
        return number
    raise AssertionError(f"unhandled field type {kind} for {var}")  # pragma: no cover
