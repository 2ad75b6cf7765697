"""Typed models of configs/runners.yaml and of one sweep config entry (strict: unknown keys rejected).

The models only check what one entry can know about itself. Cross-file checks (the runner exists,
GPUs fit the node, an offload budget exists) happen in :mod:`agentsweep.config.matrix`, which sees both.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

Engine = Literal["vllm", "sglang", "sim"]
Offload = Literal["on", "off", "noprefix"]
OffloadConnector = Literal["native", "simple"]
TimingStrategy = Literal["think-only", "original", "api-scaled"]
Api = Literal["chat", "completions"]
Client = Literal["replay", "aiperf"]
ContainerRuntime = Literal["pyxis", "docker", "none"]
Hardware = Literal["h200", "b200", "mi355x"]
# A Slurm GRES type as a site names it in gres.conf (gpu:<type>:N).
GresType = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]

OFFLOAD_MODES: tuple[str, ...] = ("on", "off", "noprefix")
DEFAULT_OFFLOAD: tuple[str, ...] = ("on", "off")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LAUNCHER = re.compile(r"^runners/[A-Za-z0-9_.-]+\.sh$")
TP_KEY = re.compile(r"^tp([1-9][0-9]*)$")

PositiveInt = Annotated[int, Field(gt=0)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class _Strict(BaseModel):
    # allow_inf_nan=False: `.inf`/`.nan` in YAML are floats, but no field means anything with them
    # (an infinite speed or budget would also leave the matrix JSON invalid).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# Upper bounds no real sweep comes near; past them a value is a typo or an attack (users: 10**11 made
# the replayer run out of memory). docs/configs.md lists them.
MAX_USERS = 100_000
MAX_DURATION_S = 7 * 86_400  # a week of replay per cell
MAX_TP = 1024  # also the bound on ep and gpus_per_node
MAX_TOKENS = 2**31 - 1  # max_context; the trace loader bounds token counts the same way
MAX_TIME_LIMIT_MIN = 30 * 24 * 60
MAX_CPU_DRAM_GB = 1 << 20  # 1 PiB per node
MAX_SPEED = 10_000.0
MAX_DELAY_S = 86_400.0
MAX_SEED = 2**32 - 1
MAX_WARMUP_REQUESTS = 100_000
MAX_PARALLEL = 256  # GitHub's matrix limit
MAX_ENTRY_CELLS = 10_000  # tp x users x offload of one key, before filters: weeks of GPU time
# Characters no name may hold: C0/C1 controls, DEL, Unicode line/paragraph separators and bidirectional
# overrides (they break one-line messages, tables, logs and terminals).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _printable(value: Any) -> Any:
    """A name (or list of names) without control characters; other types pass through to pydantic."""
    for item in value if isinstance(value, list | tuple) else [value]:
        if isinstance(item, str):
            bad = _CONTROL.search(item)
            if bad:
                raise ValueError(f"control character {bad.group()!r} in {_brief(item)}")
    return value


class RunnerSpec(_Strict):
    """Facts about one kind of GPU node (one key of configs/runners.yaml)."""

    runs_on: Annotated[list[NonEmptyStr], Field(min_length=1)]
    launcher: str
    gpus_per_node: Annotated[int, Field(gt=0, le=MAX_TP)]
    gres_type: GresType | None = None
    # Which hardware the engine recipes' quirks and the simulated engine's profile follow; defaults
    # to gres_type when the site's GRES type is one of the known names.
    hardware: Hardware | None = None
    cpu_dram_gb: Annotated[float, Field(ge=0, le=MAX_CPU_DRAM_GB)]
    partition: str | None = None
    account: str | None = None
    time_limit_min: Annotated[int, Field(gt=0, le=MAX_TIME_LIMIT_MIN)] = 240
    exclude: list[NonEmptyStr] = Field(default_factory=list)
    container_runtime: ContainerRuntime
    hf_cache: str | None = None

    @model_validator(mode="after")
    def _hardware_from_gres(self) -> RunnerSpec:
        if self.hardware is None and self.gres_type in ("h200", "b200", "mi355x"):
            object.__setattr__(self, "hardware", self.gres_type)
        return self

    @field_validator("launcher")
    @classmethod
    def _launcher_shape(cls, value: str) -> str:
        if not _LAUNCHER.match(value):
            raise ValueError(
                f"must be a script under runners/ like runners/launch_<key>.sh, got {_brief(value)}"
            )
        return value

    @field_validator("runs_on", "partition", "account", "exclude", "hf_cache", mode="before")
    @classmethod
    def _names_printable(cls, value: Any) -> Any:
        return _printable(value)


class ReplaySpec(_Strict):
    """Options handed to the trace replayer for every cell of the entry."""

    max_delay: Annotated[float, Field(ge=0, le=MAX_DELAY_S)] = 60.0
    advance_min: Annotated[float, Field(ge=0, le=1)] = 0.0
    advance_max: Annotated[float, Field(ge=0, le=1)] = 0.0
    timing_strategy: TimingStrategy = "think-only"
    ignore_eos: bool = True
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    warmup_requests: Annotated[int, Field(ge=0, le=MAX_WARMUP_REQUESTS)] = 1
    max_context: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0
    api: Api = "chat"

    @model_validator(mode="after")
    def _advance_order(self) -> ReplaySpec:
        if self.advance_min > self.advance_max:
            raise ValueError(
                f"advance_min ({self.advance_min}) must not exceed advance_max ({self.advance_max})"
            )
        return self


def _as_list(value: Any) -> Any:
    """Let `users: 4` mean `users: [4]` (and the same for offload)."""
    return value if isinstance(value, list | tuple) else [value]


def _dedupe(values: list[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(values))


class SearchPoint(_Strict):
    """One TP setting of the search space: its users and offload axes (deduped, in given order)."""

    tp: Annotated[int, Field(gt=0, le=MAX_TP)]
    ep: PositiveInt = 1
    users: Annotated[tuple[Annotated[int, Field(gt=0, le=MAX_USERS)], ...], Field(min_length=1)]
    offload: Annotated[tuple[Offload, ...], Field(min_length=1)] = DEFAULT_OFFLOAD
    # Where the point came from in the file ("tp4" or "[0]"), for error messages.
    label: str = Field(default="", exclude=True)

    @field_validator("users", "offload", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return tuple(_as_list(value))

    @field_validator("users", "offload", mode="after")
    @classmethod
    def _unique(cls, value: tuple[Any, ...]) -> tuple[Any, ...]:
        return _dedupe(list(value))

    @field_validator("ep", mode="after")
    @classmethod
    def _ep_fits(cls, ep: int, info: ValidationInfo) -> int:
        tp = info.data.get("tp")
        if tp is not None and (ep > tp or tp % ep):
            raise ValueError(f"ep {ep} must divide tp {tp} (expert parallelism runs inside the TP group)")
        return ep


class SweepSpec(_Strict):
    """One config key: everything a cell needs except the runner facts."""

    description: str = ""
    runner: NonEmptyStr
    engine: Engine
    model: NonEmptyStr
    precision: NonEmptyStr
    image: str = Field(default="", validate_default=True)
    duration: Annotated[int, Field(gt=0, le=MAX_DURATION_S)]
    traces: NonEmptyStr
    replay: ReplaySpec = Field(default_factory=ReplaySpec)
    engine_args: str = ""
    engine_env: dict[str, Any] = Field(default_factory=dict)
    offload_connector: OffloadConnector = "native"
    speed: Annotated[float, Field(gt=0, le=MAX_SPEED)] = 1.0
    client: Client = "replay"
    max_parallel: Annotated[int, Field(gt=0, le=MAX_PARALLEL)] | None = None
    search_space: tuple[SearchPoint, ...]

    _key: str = PrivateAttr(default="")
    _source: str = PrivateAttr(default="")

    @property
    def key(self) -> str:
        """The config key this entry was loaded from (set by load_sweep)."""
        return self._key

    @property
    def source(self) -> str:
        """The config file this entry was loaded from, as shown in errors."""
        return self._source

    @field_validator("runner", "model", "precision", "image", "traces", mode="before")
    @classmethod
    def _names_printable(cls, value: Any) -> Any:
        return _printable(value)

    @field_validator("engine_args", mode="before")
    @classmethod
    def _quote_args(cls, value: Any) -> Any:
        """A list of arguments or one command-line string; stored as one shell-quoted string.

        Line breaks and tabs may separate arguments in the string form; no argument may hold one.
        """
        if isinstance(value, list | tuple):
            if not all(isinstance(v, str) for v in value):
                raise ValueError("list items must be strings (quote numbers)")
            return shlex.join(_printable(list(value)))
        if not isinstance(value, str):
            raise ValueError(f"expected a string or a list of strings, got {_brief(value)}")
        try:
            return shlex.join(_printable(shlex.split(value)))
        except ValueError as err:
            if "control character" in str(err):
                raise
            raise ValueError(f"cannot be split like a shell command line ({err})") from None

    @field_validator("engine_env", mode="after")
    @classmethod
    def _env_strings(cls, value: dict[str, Any]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, val in value.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise ValueError(f"{_brief(name)} is not a valid environment variable name")
            if isinstance(val, bool) or not isinstance(val, str | int | float):
                raise ValueError(f"{name}: value must be a string or a number (quote it), got {_brief(val)}")
            try:
                _printable(val)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
            out[name] = str(val)
        return out

    @field_validator("search_space", mode="before")
    @classmethod
    def _normalize_space(cls, value: Any) -> Any:
        if isinstance(value, list | tuple) and value and all(_normalized(v) for v in value):
            return tuple(value)  # already normalized by the loader
        try:
            return tuple(normalize_search_space(value))
        except SearchSpaceShapeError as err:
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.path).lstrip(".")
            raise ValueError(f"{where}: {err}" if where else str(err)) from None

    @field_validator("image", mode="after")
    @classmethod
    def _image_for_real_engines(cls, image: str, info: ValidationInfo) -> str:
        engine = info.data.get("engine")
        if engine in ("vllm", "sglang") and not image:
            raise ValueError(f"engine {engine} needs a container image")
        return image

    @field_validator("speed", mode="after")
    @classmethod
    def _speed_only_sim(cls, speed: float, info: ValidationInfo) -> float:
        engine = info.data.get("engine")
        if engine in ("vllm", "sglang") and speed != 1.0:
            raise ValueError(f"only the simulated engine (engine: sim) can run faster; {engine} needs 1.0")
        return speed

    @model_validator(mode="after")
    def _bounded_space(self) -> SweepSpec:
        # Checked before the matrix is built: an alias-repeated search space could ask for millions.
        cells = sum(len(p.users) * len(p.offload) for p in self.search_space)
        if cells > MAX_ENTRY_CELLS:
            raise ValueError(
                f"search_space: {cells} cells (tp x users x offload) is over the {MAX_ENTRY_CELLS} "
                "limit for one key; split it into several keys"
            )
        return self

    @property
    def engine_env_json(self) -> str:
        return json.dumps(self.engine_env, sort_keys=True, separators=(",", ":"))


class SearchSpaceShapeError(ValueError):
    """A search space that is neither the per-TP mapping nor a list; `path` is relative to it."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path = path


def normalize_search_space(value: Any) -> list[Any]:
    """Turn either accepted form into a list of SearchPoint-shaped dicts (or SearchPoints).

    Per-TP form: ``{tp4: {users: [...], offload: [...], ep: 4}}``.
    List form: ``[{tp: 4, ep: 4, users: [...], offload: [...]}]``.
    Shape problems raise SearchSpaceError; field problems are left to pydantic.
    """
    if isinstance(value, tuple | list):
        if not value:
            raise SearchSpaceShapeError((), "must not be empty")
        out: list[Any] = []
        for i, item in enumerate(value):
            if isinstance(item, SearchPoint):
                out.append(item)
            elif isinstance(item, dict):
                _no_label(item, (i,))
                out.append({**item, "label": f"[{i}]"})
            else:
                raise SearchSpaceShapeError(
                    (i,), f"expected a mapping like {{tp: 4, users: [1, 2]}}, got {_brief(item)}"
                )
        return out
    if isinstance(value, dict):
        if not value:
            raise SearchSpaceShapeError((), "must not be empty")
        out = []
        for name, item in value.items():
            match = TP_KEY.match(str(name))
            if not match:
                raise SearchSpaceShapeError((str(name),), "expected a key like tp4 (tp<N>, N >= 1)")
            if not isinstance(item, dict):
                raise SearchSpaceShapeError(
                    (str(name),), f"expected a mapping like {{users: [1, 2]}}, got {_brief(item)}"
                )
            _no_label(item, (str(name),))
            if "tp" in item:
                raise SearchSpaceShapeError((str(name), "tp"), "the tp comes from the key; remove it here")
            out.append({"tp": int(match.group(1)), **item, "label": str(name)})
        return out
    raise SearchSpaceShapeError((), "expected a mapping of tp<N> entries or a list of {tp: N, ...} entries")


def _no_label(item: dict[Any, Any], path: tuple[str | int, ...]) -> None:
    # `label` is internal (where a point came from); a config may not set it.
    if "label" in item:
        raise SearchSpaceShapeError((*path, "label"), "unknown field")


def _normalized(item: Any) -> bool:
    return isinstance(item, SearchPoint) or (isinstance(item, dict) and "label" in item)
