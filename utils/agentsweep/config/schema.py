"""Typed models of configs/runners.yaml and of one sweep config entry (strict: unknown keys rejected).

The models only check what one entry can know about itself. Cross-file checks (the runner exists,
GPUs fit the node, an offload budget exists) happen in :mod:`agentsweep.config.matrix`, which sees both.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agentsweep.contract.cell import (
    DEFAULT_INTER_NODE_GBS,
    DEFAULT_INTRA_NODE_GBS,
    HARDWARE,
    MAX_CPU_DRAM_GB,
    MAX_NODES,
    MAX_REPLICAS,
    MAX_TP,
    MAX_USERS,
    EngineSettings,
    Frozen,
    GresType,
    Hardware,
    LinkGbs,
    NodeGpus,
    NonEmptyStr,
    Offload,
    PositiveInt,
    PowerInterval,
    PowerSource,
    ReplayOptions,
    RoleShape,
    RouterPolicy,
    RunnerFacts,
    ValidityLimits,
    disaggregation_problem,
    instance_tps,
    power_endpoint_problem,
    preset_duration_error,
    printable,
)
from agentsweep.contract.errors import brief
from agentsweep.contract.slo import SloTier, UserSearch

ContainerRuntime = Literal["pyxis", "docker", "none"]

DEFAULT_OFFLOAD: tuple[Offload, ...] = ("on", "off")

_LAUNCHER = re.compile(r"^runners/[A-Za-z0-9_.-]+\.sh$")
TP_KEY = re.compile(r"^tp([1-9][0-9]*)$")

MAX_TIME_LIMIT_MIN = 30 * 24 * 60
MAX_PARALLEL = 256  # GitHub's matrix limit
MAX_ENTRY_CELLS = 10_000  # tp x users x offload of one key, before filters: weeks of GPU time


class RunnerSpec(Frozen):
    """Facts about one kind of GPU node (one key of configs/runners.yaml)."""

    runs_on: Annotated[list[NonEmptyStr], Field(min_length=1)]
    launcher: str
    gpus_per_node: NodeGpus
    gres_type: GresType | None = None
    # Which hardware the engine recipes' quirks and the simulated engine's profile follow; defaults
    # to gres_type when the site's GRES type is one of the known names, else to the runner's key when
    # that is one (a runner `b300`). A simulated entry's runner must have one (the matrix says so).
    hardware: Hardware | None = None
    cpu_dram_gb: Annotated[float, Field(ge=0, le=MAX_CPU_DRAM_GB)]
    partition: str | None = None
    account: str | None = None
    time_limit_min: Annotated[int, Field(gt=0, le=MAX_TIME_LIMIT_MIN)] = 240
    exclude: list[NonEmptyStr] = Field(default_factory=list)
    container_runtime: ContainerRuntime
    hf_cache: str | None = None
    # Nodes one cell may span (a scale-out cell takes one allocation of that many nodes).
    max_nodes: Annotated[int, Field(gt=0, le=MAX_NODES)] = 1
    # KV transfer bandwidth of disaggregated cells, GB/s per GPU: inside a node (NVLink, xGMI) and
    # between nodes (the scale-out network); the simulated engine models transfers with them.
    intra_node_gbs: LinkGbs = DEFAULT_INTRA_NODE_GBS
    inter_node_gbs: LinkGbs = DEFAULT_INTER_NODE_GBS
    # GPU power beside every cell (docs/energy.md): where the samples come from, the DCGM endpoint,
    # and the seconds between samples.
    power_source: PowerSource = "none"
    power_endpoint: str = ""
    power_interval_s: PowerInterval = 0.5

    def facts(self) -> RunnerFacts:
        """What every cell of this runner carries (the matrix copies it into each one)."""
        return RunnerFacts(
            hardware=self.hardware or "",
            gres_type=self.gres_type or "",
            gpus_per_node=self.gpus_per_node,
            intra_node_gbs=self.intra_node_gbs,
            inter_node_gbs=self.inter_node_gbs,
            power_source=self.power_source,
            power_endpoint=self.power_endpoint,
            power_interval_s=self.power_interval_s,
        )

    @field_validator("power_endpoint")
    @classmethod
    def _power_endpoint_shape(cls, value: str) -> str:
        return power_endpoint_problem(value)

    @model_validator(mode="after")
    def _power_endpoint_for_dcgm(self) -> RunnerSpec:
        if self.power_endpoint and self.power_source != "dcgm":
            raise ValueError(
                f"power_endpoint is read only with power_source dcgm (power_source is {self.power_source})"
            )
        return self

    def named(self, key: str) -> RunnerSpec:
        """This runner under its key in runners.yaml: a key naming a hardware stands for it when neither
        hardware nor gres_type names one."""
        if self.hardware is None and key in HARDWARE:
            return self.model_copy(update={"hardware": key})
        return self

    @model_validator(mode="after")
    def _hardware_from_gres(self) -> RunnerSpec:
        if self.hardware is None and self.gres_type in HARDWARE:
            object.__setattr__(self, "hardware", self.gres_type)
        return self

    @field_validator("launcher")
    @classmethod
    def _launcher_shape(cls, value: str) -> str:
        if not _LAUNCHER.match(value):
            raise ValueError(
                f"must be a script under runners/ like runners/launch_<key>.sh, got {brief(value)}"
            )
        return value

    @field_validator("runs_on", "partition", "account", "exclude", "hf_cache", mode="before")
    @classmethod
    def _names_printable(cls, value: Any) -> Any:
        return printable(value)


def _as_list(value: Any) -> Any:
    """Let `users: 4` mean `users: [4]` (and the same for offload)."""
    return value if isinstance(value, list | tuple) else [value]


def _dedupe(values: list[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(values))


class SearchPoint(Frozen):
    """One TP setting of the search space: its users and offload axes (deduped, in given order).

    ``users`` is a list of counts (one cell each) or ``{search: [LOW, HIGH], ...}``: one capacity cell
    per offload mode and router that searches the users (kept in ``search``; ``users`` is then empty).
    """

    tp: Annotated[int, Field(gt=0, le=MAX_TP)]
    ep: PositiveInt = 1
    users: tuple[Annotated[int, Field(gt=0, le=MAX_USERS)], ...] = ()
    search: UserSearch | None = None
    offload: Annotated[tuple[Offload, ...], Field(min_length=1)] = DEFAULT_OFFLOAD
    # Scale-out: engine instances of tp GPUs each, and the router policies to sweep in front of them.
    replicas: Annotated[int, Field(gt=0, le=MAX_REPLICAS)] = 1
    router: tuple[RouterPolicy, ...] = ()
    # Disaggregated prefill/decode (both or neither); tp then defaults to decode's tp.
    prefill: RoleShape | None = None
    decode: RoleShape | None = None
    # Where the point came from in the file ("tp4" or "[0]"), for error messages.
    label: str = Field(default="", exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _users_search(cls, data: Any) -> Any:
        """``users: {search: [...]}`` goes to ``search``; ``search`` itself is not a config key."""
        if not isinstance(data, dict):
            return data
        users = data.get("users")
        if "search" in data and users != ():  # () and a search: a point as model_dump gives it back
            raise ValueError("unknown field 'search' (a search is given as users: {search: [LOW, HIGH]})")
        if isinstance(users, dict):
            return {**data, "users": (), "search": users}
        return data

    @field_validator("users", "offload", "router", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return tuple(_as_list(value))

    @model_validator(mode="after")
    def _users_given(self) -> SearchPoint:
        if not self.users and self.search is None:
            raise ValueError("users: must not be empty (give user counts, or {search: [LOW, HIGH]})")
        return self

    @field_validator("users", "offload", "router", mode="after")
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

    @model_validator(mode="before")
    @classmethod
    def _tp_from_decode(cls, data: Any) -> Any:
        if isinstance(data, dict) and (data.get("prefill") is None) != (data.get("decode") is None):
            missing = "decode" if data.get("decode") is None else "prefill"
            raise ValueError(f"a disaggregated point needs both prefill and decode; {missing} is missing")
        decode = data.get("decode") if isinstance(data, dict) else None
        if isinstance(decode, dict) and "tp" in decode and "tp" not in data:
            return {**data, "tp": decode["tp"]}
        return data

    @model_validator(mode="after")
    def _disaggregated(self) -> SearchPoint:
        problem = disaggregation_problem(
            "point", self.prefill, self.decode, self.replicas, self.tp, bool(self.router)
        )
        if problem:
            raise ValueError(problem)
        return self

    @property
    def instance_tps(self) -> list[int]:
        """The TP of every engine instance of the point's cells (prefill first)."""
        return instance_tps(self.tp, self.replicas, self.prefill, self.decode)

    @model_validator(mode="after")
    def _replicas_need_router(self) -> SearchPoint:
        if self.replicas > 1 and not self.router:
            raise ValueError(
                f"replicas {self.replicas} need a router policy, e.g. router: [round_robin, cache_aware]"
            )
        return self

    @property
    def routers(self) -> tuple[RouterPolicy | Literal[""], ...]:
        """The router axis: the policies given, or "" (no router) for a point without one."""
        return self.router or ("",)


class SweepSpec(EngineSettings):
    """One config key: the engine settings every cell shares, its replay options and search space."""

    description: str = ""
    # Stricter in a config than in a cell given by hand: a runner and a precision are required, and a
    # real engine's missing image is caught here (validate_default runs the check on the default "").
    runner: NonEmptyStr
    precision: NonEmptyStr
    image: str = Field(default="", validate_default=True)
    replay: ReplayOptions = Field(default_factory=ReplayOptions)
    validity: ValidityLimits = Field(default_factory=ValidityLimits)
    max_parallel: Annotated[int, Field(gt=0, le=MAX_PARALLEL)] | None = None
    # SLO tiers of the entry's capacity cells (the loader parses the block); None: DEFAULT_TIERS.
    slo: tuple[SloTier, ...] | None = None
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

    @model_validator(mode="before")
    @classmethod
    def _digest_from_the_lock(cls, data: Any) -> Any:
        """A config entry names its image; the digest comes from the lock beside it (or the image)."""
        if isinstance(data, dict) and "image_digest" in data:
            raise ValueError(
                "image_digest is not set in a config: `agentsweep images lock` writes it to "
                "images.lock.yaml beside the configs (or write image: REPO:TAG@sha256:...)"
            )
        return data

    @field_validator("image", mode="after")
    @classmethod
    def _image_for_real_engines(cls, image: str, info: ValidationInfo) -> str:
        engine = info.data.get("engine")
        if engine in ("vllm", "sglang") and not image:
            raise ValueError(f"engine {engine} needs a container image")
        return image

    @model_validator(mode="after")
    def _preset_duration(self) -> SweepSpec:
        problem = preset_duration_error(self.replay.preset, self.duration)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _bounded_space(self) -> SweepSpec:
        # Checked before the matrix is built: an alias-repeated search space could ask for millions.
        cells = sum(max(1, len(p.users)) * len(p.offload) * len(p.routers) for p in self.search_space)
        if cells > MAX_ENTRY_CELLS:
            raise ValueError(
                f"search_space: {cells} cells (tp x users x offload) is over the {MAX_ENTRY_CELLS} "
                "limit for one key; split it into several keys"
            )
        return self


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
                    (i,), f"expected a mapping like {{tp: 4, users: [1, 2]}}, got {brief(item)}"
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
                    (str(name),), f"expected a mapping like {{users: [1, 2]}}, got {brief(item)}"
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
