"""The matrix cell: one typed, frozen value, defined here and nowhere else (ARCHITECTURE.md §2).

The matrix generator makes cells; the workflow, the launchers, ``agentsweep cell``, the local sweep,
collect and the experimental clients read them. A cell crosses every process boundary as ONE JSON
value (``Cell.to_json`` / ``Cell.parse``): the workflow input ``cell``, the launcher variable
``AGENTSWEEP_CELL`` and ``agentsweep cell --cell JSON|@file``.

Its fields come in groups, each a model of its own so that the sweep config reuses them instead of
restating them: ``CellAxes`` (what the matrix varies) and ``EngineSettings`` (what a config entry fixes
for all its cells) are the cell's own fields, the ones the GitHub workflow and every report read
first; ``RunnerFacts`` (what the matrix resolves from configs/runners.yaml for the cell's runner, so
that no later part looks the runner up again), ``ReplayOptions`` (the entry's ``replay:`` block) and
``ValidityLimits`` (its ``validity:`` block) are nested, as ``node``, ``replay`` and ``limits``
(``GROUPS``; schema 2). Adding a field to one of them is the whole change: the config accepts it (the
runner file, for a runner fact), the matrix copies it into every cell, and the workflow, the
launchers and collect carry it without a list to update. ``Cell.flat`` is the one-level view
(summary.csv's columns, the recipe fingerprint); a cell of schema 1, flat, still reads.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args

from kv_cache_tester.inputfiles import InputFileProblem, read_limited
from kv_cache_tester.replay.memory import MAX_PROMPT_TOKENS
from kv_cache_tester.replay.presets import MIN_DURATION_S, PRESETS
from kv_cache_tester.replay.presets import resolve as resolve_preset
from pydantic import (
    BaseModel,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agentsweep.contract.accuracy import AccuracySpec
from agentsweep.contract.base import MAX_POWER_INTERVAL_S as MAX_POWER_INTERVAL_S
from agentsweep.contract.base import MIN_POWER_INTERVAL_S as MIN_POWER_INTERVAL_S
from agentsweep.contract.base import Frozen as Frozen
from agentsweep.contract.base import PowerInterval as PowerInterval
from agentsweep.contract.engine_args import engine_args_conflict
from agentsweep.contract.errors import CONTROL, brief, validation_message
from agentsweep.contract.hardware import HARDWARE as HARDWARE
from agentsweep.contract.hardware import Hardware as Hardware
from agentsweep.contract.hardware import hardware_label
from agentsweep.contract.secrets import is_secret_flag, is_secret_name
from agentsweep.contract.slo import CapacitySpec
from agentsweep.errors import InputError

Engine = Literal["vllm", "sglang", "sim"]
Offload = Literal["on", "off", "noprefix"]
OffloadConnector = Literal["native", "simple"]
TimingStrategy = Literal["think-only", "original", "api-scaled"]
Api = Literal["chat", "completions"]
Client = Literal["replay", "aiperf"]
# Named replay option sets (kv_cache_tester.replay.presets); "none" leaves every option as given.
Preset = Literal["none", "agentx"]
# A router's replica-selection policy, in engine-neutral names (each router program maps them to its
# own flag values; docs/scaleout.md says what each does). "" = no router (one engine, no proxy).
RouterPolicy = Literal["round_robin", "cache_aware", "consistent_hash", "power_of_two", "random"]
# The policies a virtual-clock cell's replicas are routed by in its own process (virtual.endpoint), and
# what its router.json names as the router program. cache_aware keeps the router program's own prefix
# tree, so a cell with it runs on the wall clock, with the program.
VIRTUAL_ROUTER_POLICIES: tuple[str, ...] = ("consistent_hash", "round_robin", "random", "power_of_two")
IN_PROCESS_ROUTER = "in-process"
# The router program in front of the replicas; auto = smg for sglang cells, vllm-router otherwise.
RouterProgram = Literal["auto", "vllm-router", "smg"]
# Where a runner's GPU power samples come from (docs/energy.md): a DCGM exporter's /metrics, nvidia-smi's
# query loop, amd-smi's JSON, or nothing.
PowerSource = Literal["dcgm", "nvidia-smi", "amd-smi", "none"]

ENGINES: tuple[str, ...] = get_args(Engine)
OFFLOAD_MODES: tuple[str, ...] = get_args(Offload)
CONNECTORS: tuple[str, ...] = get_args(OffloadConnector)
TIMING_STRATEGIES: tuple[str, ...] = get_args(TimingStrategy)
APIS: tuple[str, ...] = get_args(Api)
CLIENTS: tuple[str, ...] = get_args(Client)
ROUTER_POLICIES: tuple[str, ...] = get_args(RouterPolicy)
ROUTER_PROGRAMS: tuple[str, ...] = get_args(RouterProgram)
POWER_SOURCES: tuple[str, ...] = get_args(PowerSource)

# The one engine that can run faster than real time (its clock is simulated).
SIMULATED_ENGINE = "sim"
# Safe as a file name, a path component and an artifact name; never starts with '.' or '-'.
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The launcher variable that carries the cell as JSON.
CELL_ENV_VAR = "AGENTSWEEP_CELL"

# The replayer's flag names of the replay options whose cell names differ.
REPLAYER_NAMES = {"warmup_requests": "warmup_requests_per_user"}

# Upper bounds no real sweep comes near; past them a value is a typo or an attack (users: 10**11 made
# the replayer run out of memory). docs/configs.md lists them.
MAX_USERS = 100_000
MAX_DURATION_S = 7 * 86_400  # a week of replay per cell
MAX_TP = 1024  # also the bound on ep and gpus_per_node
# max_context: the replayer builds no prompt longer than this (its memory bound), so neither may a cell.
MAX_CONTEXT_TOKENS = MAX_PROMPT_TOKENS
MAX_SPEED = 10_000.0
MAX_DELAY_S = 86_400.0
MAX_SEED = 2**32 - 1
MAX_WARMUP_REQUESTS = 100_000
MAX_CPU_DRAM_GB = 1 << 20  # 1 PiB
MAX_REPLICAS = 256
MAX_NODES = 1024
MAX_LINK_GBS = 1e5
# ``--cell @FILE``: a cell's JSON is a few KiB; past this the file is not one.
CELL_FILE_MAX_BYTES = 16 << 20

# What a runner without these figures in runners.yaml gets (GB/s per GPU, each direction): NVLink 4
# inside a node, one 400 Gb/s NIC per GPU between nodes.
DEFAULT_INTRA_NODE_GBS = 450.0
DEFAULT_INTER_NODE_GBS = 50.0

PositiveInt = Annotated[int, Field(gt=0)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
Fraction = Annotated[float, Field(ge=0, le=1)]
# A Slurm GRES type as a site names it in gres.conf (gpu:<type>:N).
GRES_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
GresType = Annotated[str, Field(pattern=f"^{GRES_NAME}$")]
# GPUs of one node.
NodeGpus = Annotated[int, Field(gt=0, le=MAX_TP)]
# A KV transfer link's bandwidth, GB/s per GPU and direction.
LinkGbs = Annotated[float, Field(gt=0, le=MAX_LINK_GBS)]
# power_endpoint of a dcgm runner: "engine" (each engine instance's own /metrics: the simulated engine
# serves DCGM metrics there), a URL with {address} (the node's address), or "" for the exporter's
# default, http://{address}:9400/metrics.
ENGINE_POWER_ENDPOINT = "engine"


def printable(value: Any) -> Any:
    """A name (or list of names) without control characters; other types pass through to pydantic."""
    for item in value if isinstance(value, list | tuple) else [value]:
        if isinstance(item, str):
            bad = CONTROL.search(item)
            if bad:
                raise ValueError(f"control character {bad.group()!r} in {brief(item)}")
    return value


def _printable_args(words: list[str]) -> list[str]:
    """``printable`` for command-line words; the value of a secret flag (``--api-key X``,
    ``--hf-token=X``) is never repeated in the error."""
    for i, word in enumerate(words):
        bad = CONTROL.search(word)
        if not bad:
            continue
        flag = word.split("=", 1)[0] if word.startswith("-") and "=" in word else (words[i - 1] if i else "")
        if flag.startswith("-") and is_secret_flag(flag):
            raise ValueError(f"control character {bad.group()!r} in the value of {flag}")
        raise ValueError(f"control character {bad.group()!r} in {brief(word)}")
    return words


class ReplayOptions(Frozen):
    """How the replayer drives the users of a cell (a config entry's ``replay:`` block)."""

    # 0: the trace's own context lengths, cut at MAX_CONTEXT_TOKENS as the replayer does
    max_context: Annotated[int, Field(ge=0, le=MAX_CONTEXT_TOKENS)] = 0
    max_delay: Annotated[float, Field(ge=0, le=MAX_DELAY_S)] = 60.0
    advance_min: Fraction = 0.0
    advance_max: Fraction = 0.0
    timing_strategy: TimingStrategy = "think-only"
    ignore_eos: bool = True
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    warmup_requests: Annotated[int, Field(ge=0, le=MAX_WARMUP_REQUESTS)] = 1
    # Warm-up requests after a lane's first ask for one output token and skip their delays.
    warmup_one_token: bool = False
    # With nothing in flight, pending delays advance so the next request leaves within this many
    # trace seconds (0: off); more than this share of profiled requests failing ends the run (0: never).
    system_idle_cap: Annotated[float, Field(ge=0, le=MAX_DELAY_S)] = 0.0
    failed_request_threshold: Annotated[float, Field(ge=0, lt=1)] = 0.0
    api: Api = "chat"
    preset: Preset = "none"

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """A preset fills the options left unset; one given against it is refused."""
        if not isinstance(data, dict) or data.get("preset", "none") in ("none", None):
            return data
        preset = data["preset"]
        if preset not in PRESETS:
            return data  # the Literal check says what is wrong
        given = {REPLAYER_NAMES.get(str(k), str(k)): v for k, v in data.items()}
        defaults = {REPLAYER_NAMES.get(k, k): f.default for k, f in ReplayOptions.model_fields.items()}
        try:
            values = resolve_preset(preset, given, defaults)
        except ValueError as err:  # the replayer's message names its flags: name the cell's fields
            cell_names_of = {f"--{v.replace('_', '-')}": k for k, v in REPLAYER_NAMES.items()}
            message = re.sub(
                r"--([a-z-]+)",
                lambda m: cell_names_of.get(m.group(0), m.group(1).replace("-", "_")),
                str(err),
            )
            raise ValueError(message) from None
        cell_names = {v: k for k, v in REPLAYER_NAMES.items()}
        return {**data, **{cell_names.get(k, k): v for k, v in values.items()}}

    @model_validator(mode="after")
    def _advance_order(self) -> ReplayOptions:
        if self.advance_min > self.advance_max:
            raise ValueError(
                f"advance_min ({self.advance_min}) must not exceed advance_max ({self.advance_max})"
            )
        return self


class ValidityLimits(Frozen):
    """When a run counts (a config entry's ``validity:`` block); a check past its limit makes it INVALID.

    Shares are fractions of the requests sent in the profiling window; gaps are relative differences
    between what the client summed and what the server's counters say.
    """

    max_failed_share: Fraction = 0.02  # failed + abandoned (stalls and timeouts included)
    max_context_error_share: Fraction = 0.01
    min_window_coverage: Fraction = 0.95  # share of the window's seconds holding a token arrival
    # Requests that must finish ok in the window: fewer make its percentiles and rates noise.
    min_window_requests: Annotated[int, Field(ge=0)] = 10
    # A lane idle (nothing in flight, no think time pending) longer than this, in the engine's
    # clock, is stuck; 0 means the entry's max_delay plus 10 s.
    max_lane_idle_s: Annotated[float, Field(ge=0)] = 0.0
    max_dispatch_lag_p99_s: Annotated[float, Field(gt=0)] = 0.25  # wall clock: the client's own lag
    max_client_cpu_share: Annotated[float, Field(gt=0)] = 0.9
    # A simulated cell: the share of its requests' time (client E2E x speed) that the engine's own
    # timelines do not account for, i.e. the client and HTTP path's (summary engine_clock.gap).
    max_client_clock_share: Fraction = 0.5
    max_request_count_gap: Fraction = 0.01
    max_prompt_token_gap: Fraction = 0.01
    max_cached_token_gap: Fraction = 0.01
    max_throughput_drift: Annotated[float, Field(ge=0)] = 0.5  # (max - min) / mean over window thirds


class EngineSettings(Frozen):
    """What a config entry fixes for all its cells: the runner, the engine and how it is started."""

    runner: NonEmptyStr = "local"
    engine: Engine
    model: NonEmptyStr
    precision: str = ""
    image: str = ""
    # The manifest digest the image is pinned to (the one written into image, else the matrix's from
    # configs/images.lock.yaml); "": not pinned. Preflight and the cell refuse a copy that differs.
    image_digest: Annotated[str, Field(pattern=r"^(sha256:[0-9a-f]{64})?$")] = ""
    duration: Annotated[int, Field(gt=0, le=MAX_DURATION_S)]
    traces: NonEmptyStr
    offload_connector: OffloadConnector = "native"
    speed: Annotated[float, Field(gt=0, le=MAX_SPEED)] = 1.0
    # wall: the engine serves HTTP in its own process and its clock runs ``speed`` times the wall
    # clock's (the reference); virtual (the simulated engine only): engine, replayer and collectors in
    # one process on a virtual clock, no socket and no waiting (docs/virtual-clock.md).
    clock: Literal["wall", "virtual"] = "wall"
    client: Client = "replay"
    engine_args: str = ""  # one shell-quoted command line, appended to the recipe's
    # Extra engine environment, NAME: value (a config may give numbers; each is kept as its text).
    engine_env: dict[str, str] = Field(default_factory=dict)
    router_program: RouterProgram = "auto"  # used by cells with replicas or a router policy
    router_args: str = ""  # one shell-quoted command line, appended to the router recipe's
    # Client processes, one on each of this many nodes of the cell's allocation, that share the lanes
    # (kv_cache_tester.replay.merge): past what one client node drives. At most the nodes of the
    # cell's allocation and its users (the cell's plan refuses more).
    client_nodes: Annotated[int, Field(gt=0, le=MAX_NODES)] = 1
    # The model's key on InferenceX (its ``infmax_model_prefix``, e.g. llama70b) for the export; ""
    # takes it from the shipped map of model names (agentsweep.export.inferencex).
    infmax_model_prefix: Annotated[str, Field(pattern=r"^([a-z0-9][a-z0-9._-]*)?$", max_length=64)] = ""
    # The accuracy gate run after the engine is healthy and before the replay (docs/accuracy.md):
    # ``accuracy: off`` skips it, ``on`` forces it on a simulated engine, a block sets its task,
    # questions and threshold.
    accuracy: AccuracySpec = Field(default_factory=AccuracySpec)

    @field_validator("runner", "model", "precision", "image", "traces", mode="before")
    @classmethod
    def _names_printable(cls, value: Any) -> Any:
        return printable(value)

    @field_validator("engine_args", "router_args", mode="before")
    @classmethod
    def _quote_args(cls, value: Any) -> Any:
        """A list of arguments or one command-line string; stored as one shell-quoted string.

        Line breaks and tabs may separate arguments in the string form; no argument may hold one.
        """
        if isinstance(value, list | tuple):
            if not all(isinstance(v, str) for v in value):
                raise ValueError("list items must be strings (quote numbers)")
            return shlex.join(_printable_args(list(value)))
        if not isinstance(value, str):
            raise ValueError(f"expected a string or a list of strings, got {brief(value)}")
        try:
            return shlex.join(_printable_args(shlex.split(value)))
        except ValueError as err:
            if "control character" in str(err):
                raise
            raise ValueError(f"cannot be split like a shell command line ({err})") from None

    @field_validator("engine_env", mode="before")
    @classmethod
    def _env_mapping(cls, value: Any) -> Any:
        """A mapping of NAME: value (strings or numbers), or its JSON text (a cell of schema 1); kept
        sorted by name, every value as text."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"not valid JSON ({err.msg})") from None
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping of NAME: value, got {value!r}")
        out: dict[str, str] = {}
        for name, val in value.items():
            if not isinstance(name, str) or not ENV_NAME.match(name):
                raise ValueError(f"{brief(name)} is not a valid environment variable name")
            if isinstance(val, bool) or not isinstance(val, str | int | float):
                shown = "" if is_secret_name(name) else f", got {brief(val)}"
                raise ValueError(f"{name}: value must be a string or a number (quote it){shown}")
            try:
                printable(val)
            except ValueError as err:
                if is_secret_name(name):  # never repeat a secret, even a refused one
                    raise ValueError(f"{name}: its value holds a control character") from None
                raise ValueError(f"{name}: {err}") from None
            out[name] = str(val)
        return dict(sorted(out.items()))

    @field_validator("speed", mode="after")
    @classmethod
    def _speed_only_simulated(cls, speed: float, info: ValidationInfo) -> float:
        engine = info.data.get("engine")
        if engine is not None and engine != SIMULATED_ENGINE and speed != 1.0:
            raise ValueError(
                f"only the simulated engine (engine: {SIMULATED_ENGINE}) can run faster; {engine} needs 1.0"
            )
        return speed


class RoleShape(Frozen):
    """One role of a disaggregated cell: ``replicas`` engine instances of ``tp`` GPUs each."""

    replicas: Annotated[int, Field(gt=0, le=MAX_REPLICAS)] = 1
    tp: Annotated[int, Field(gt=0, le=MAX_TP)]

    @property
    def gpus(self) -> int:
        return self.replicas * self.tp

    @property
    def label(self) -> str:
        """``1x2`` for one instance of TP 2 (exp_name and report labels)."""
        return f"{self.replicas}x{self.tp}"


def shape_label(prefill: RoleShape | None, decode: RoleShape | None) -> str:
    """``p<replicas>x<tp>-d<replicas>x<tp>`` for prefill/decode roles (exp_name, summary.csv's
    ``disagg``, report labels); empty when the cell is not disaggregated."""
    if prefill is None or decode is None:
        return ""
    return f"p{prefill.label}-d{decode.label}"


def instance_tps(tp: int, replicas: int, prefill: RoleShape | None, decode: RoleShape | None) -> list[int]:
    """The TP of every engine instance, in start order (prefill instances first)."""
    if prefill is not None and decode is not None:
        return [prefill.tp] * prefill.replicas + [decode.tp] * decode.replicas
    return [tp] * replicas


def instance_names(
    replicas: int, router: str, prefill: RoleShape | None, decode: RoleShape | None
) -> list[str]:
    """The names of the engine instances behind a router, in start order: ``p<i>`` then ``d<i>`` for a
    disaggregated cell, ``r<i>`` for replicas; none for a cell whose one engine answers the client."""
    if prefill is not None and decode is not None:
        return [f"p{i}" for i in range(prefill.replicas)] + [f"d{i}" for i in range(decode.replicas)]
    return [f"r{i}" for i in range(replicas)] if router else []


def nodes_needed(instance_tps: Sequence[int], gpus_per_node: int) -> int:
    """Nodes the instances take when packed in order, a new node whenever one does not fit the rest."""
    nodes, free = 0, 0
    for tp in instance_tps:
        if tp > free:
            nodes, free = nodes + 1, gpus_per_node
        free -= tp
    return max(nodes, 1)


def disaggregation_problem(
    kind: str, prefill: RoleShape | None, decode: RoleShape | None, replicas: int, tp: int, routed: bool
) -> str | None:
    """What is wrong with a ``kind`` ("cell" or config "point") giving prefill/decode roles, or None."""
    if (prefill is None) != (decode is None):
        missing = "decode" if decode is None else "prefill"
        return f"a disaggregated {kind} needs both prefill and decode; {missing} is missing"
    if decode is None:
        return None
    if replicas != 1:
        return (
            f"replicas {replicas}: a disaggregated {kind} gives its instances in prefill.replicas "
            "and decode.replicas"
        )
    if tp != decode.tp:
        hint = " (or leave tp out)" if kind == "point" else f" in a disaggregated {kind}"
        return f"tp {tp} must equal decode.tp {decode.tp}{hint}"
    if not routed:
        return f"a disaggregated {kind} needs a router policy (router: {', '.join(ROUTER_POLICIES)})"
    return None


class CellAxes(Frozen):
    """What the matrix varies, and what follows from it for the launcher."""

    exp_name: str
    config_key: str = ""
    tp: Annotated[int, Field(gt=0, le=MAX_TP)]
    ep: Annotated[int, Field(gt=0, le=MAX_TP)] = 1
    gpus: Annotated[int, Field(gt=0, le=MAX_TP)]  # every GPU the cell takes; default: tp
    users: Annotated[int, Field(gt=0, le=MAX_USERS)]
    offload: Offload
    cpu_dram_gb: Annotated[float, Field(ge=0, le=MAX_CPU_DRAM_GB)] = (
        0.0  # KV offload budget of the whole cell (GiB); each replica gets its share
    )
    # Data-parallel engine instances of tp GPUs each, behind a router with this policy ("" = none).
    replicas: Annotated[int, Field(gt=0, le=MAX_REPLICAS)] = 1
    router: RouterPolicy | Literal[""] = ""
    # Disaggregated prefill/decode: both given or neither. Then tp is decode's tp, replicas stays 1, the
    # router runs in its prefill/decode mode and gpus counts both roles.
    prefill: RoleShape | None = None
    decode: RoleShape | None = None
    # Nodes of one allocation the cell spans (instances packed in order, none split across nodes).
    nodes: Annotated[int, Field(gt=0, le=MAX_NODES)] = 1
    # A capacity cell: the engine starts once and a search runs measured steps at user counts between
    # capacity.low and capacity.high (users is then capacity.high); None: one run at `users`.
    capacity: CapacitySpec | None = None

    @field_validator("exp_name")
    @classmethod
    def _safe_exp_name(cls, value: str) -> str:
        if not SAFE_NAME.match(value):
            raise ValueError(f"{value!r}: use only [A-Za-z0-9._-], not starting with '.' or '-'")
        return value

    @model_validator(mode="before")
    @classmethod
    def _gpus_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gpus" not in data and "tp" in data:
            if data.get("prefill") is not None and data.get("decode") is not None:
                return data  # gpus follows from the roles
            replicas = data.get("replicas", 1)
            if isinstance(replicas, int) and isinstance(data["tp"], int):
                return {**data, "gpus": data["tp"] * replicas}
        return data

    @model_validator(mode="before")
    @classmethod
    def _disagg_gpus_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gpus" not in data:
            roles = [data.get("prefill"), data.get("decode")]
            try:
                gpus = sum(int(r.get("replicas", 1)) * int(r["tp"]) for r in roles if isinstance(r, dict))
            except (KeyError, TypeError, ValueError):
                return data  # the field checks name what is wrong
            if all(isinstance(r, dict) for r in roles):
                return {**data, "gpus": gpus}
        return data

    @model_validator(mode="after")
    def _disaggregated_shape(self) -> CellAxes:
        problem = disaggregation_problem(
            "cell", self.prefill, self.decode, self.replicas, self.tp, bool(self.router)
        )
        if problem:
            raise ValueError(problem)
        if self.prefill is None or self.decode is None:
            return self
        need = self.prefill.gpus + self.decode.gpus
        if self.gpus < need:
            raise ValueError(
                f"gpus {self.gpus} is fewer than prefill {self.prefill.label} + decode {self.decode.label} "
                f"= {need}"
            )
        return self

    @model_validator(mode="after")
    def _capacity_users(self) -> CellAxes:
        if self.capacity is not None and self.users != self.capacity.high:
            raise ValueError(
                f"users {self.users}: a capacity cell's users is the top of its search range "
                f"({self.capacity.high})"
            )
        return self

    @model_validator(mode="after")
    def _replicas_routed(self) -> CellAxes:
        if self.replicas > 1 and not self.router:
            raise ValueError(
                f"replicas {self.replicas} need a router policy (router: {', '.join(ROUTER_POLICIES)})"
            )
        if self.gpus < self.tp * self.replicas:
            raise ValueError(f"gpus {self.gpus} is fewer than tp {self.tp} x replicas {self.replicas}")
        return self

    @property
    def routed(self) -> bool:
        """True when a router stands in front of the engine(s)."""
        return bool(self.router)

    @property
    def disaggregated(self) -> bool:
        """True when prefill and decode run on separate engine instances."""
        return self.prefill is not None and self.decode is not None

    @property
    def instance_tps(self) -> list[int]:
        """The TP of every engine instance, in start order (prefill instances first)."""
        return instance_tps(self.tp, self.replicas, self.prefill, self.decode)

    @property
    def instance_names(self) -> list[str]:
        """The names of its engine instances behind a router (see ``instance_names``)."""
        return instance_names(self.replicas, self.router, self.prefill, self.decode)

    @property
    def shape_label(self) -> str:
        """``p1x4-d2x1`` for a disaggregated cell, empty otherwise (see ``shape_label``)."""
        return shape_label(self.prefill, self.decode)


class RunnerFacts(Frozen):
    """What a cell needs to know of its runner's nodes: configs/runners.yaml, resolved by the matrix.

    A cell written by hand may leave them out. Its runner then stands for its hardware and GRES type
    when the runner is named after one (any key of ``HARDWARE``: h200, b200, mi355x as the shipped Slurm
    runners are, b300, gb300...), a node holds as few GPUs as pack the cell's instances onto its nodes
    (see ``Cell``), and the KV links are the defaults a runner gets without them.
    """

    # The engine recipes' quirks and the simulated engine's profile follow it; "": no GPU of a known
    # kind. A simulated cell must have one (its recipe refuses it otherwise): it is the GPU simulated.
    hardware: Hardware | Literal[""] = ""
    # "" asks Slurm for GPUs without a type (or there is no Slurm).
    gres_type: Annotated[str, Field(pattern=f"^({GRES_NAME})?$")] = ""
    # GPUs of one node: where a cell spanning several nodes starts each instance. 0 in a hand-made
    # cell: derived (see Cell).
    gpus_per_node: Annotated[int, Field(ge=0, le=MAX_TP)] = 0
    # KV transfer bandwidth between a prefill and a decode instance, GB/s per GPU: inside one node
    # (NVLink, xGMI) and between nodes (the scale-out network).
    intra_node_gbs: LinkGbs = DEFAULT_INTRA_NODE_GBS
    inter_node_gbs: LinkGbs = DEFAULT_INTER_NODE_GBS
    # Where the power sampler beside the engines reads the cell's GPUs (none: no power.csv). A simulated
    # engine is its own GPU: any source other than none samples its DCGM metrics.
    power_source: PowerSource = "none"
    power_endpoint: str = ""
    power_interval_s: PowerInterval = 0.5

    @field_validator("power_endpoint")
    @classmethod
    def _power_endpoint_shape(cls, value: str) -> str:
        return power_endpoint_problem(value)


def power_endpoint_problem(value: str) -> str:
    """``value`` when it is a valid power_endpoint (ValueError naming what is wrong otherwise)."""
    if value in ("", ENGINE_POWER_ENDPOINT):
        return value
    printable(value)
    if not re.match(r"^https?://\S+$", value):
        raise ValueError(
            f"must be {ENGINE_POWER_ENDPOINT!r} or an http(s) URL (with {{address}} for the node's "
            f"address), got {brief(value)}"
        )
    try:
        value.format(address="node")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"only {{address}} may be filled in, got {brief(value)} ({err})") from None
    return value


def preset_duration_error(preset: str, duration: int) -> str | None:
    """Why a preset refuses a replay this short, or None."""
    least = MIN_DURATION_S.get(preset)
    if least is not None and duration < least:
        return f"preset {preset} needs a duration of at least {least:g} s, got {duration}"
    return None


# The cell's JSON layout. 1: every field at the top (the cells of runs before the nesting; still read,
# see ``lift_schema_1``); 2: the runner's facts, the replay options and the validity limits as
# objects of their own (``node``, ``replay``, ``limits``) and engine_env a mapping.
CELL_SCHEMA: Final = 2
# The nested groups: each field's name in a cell of schema 1 is its name inside the group.
GROUPS: dict[str, type[Frozen]] = {"node": RunnerFacts, "replay": ReplayOptions, "limits": ValidityLimits}


def lift_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """A cell's fields with each group's fields gathered into its object (``GROUPS``).

    A cell of schema 1 had them all at the top; a field named at the top overrides the same field in
    its group's object, so ``Cell.replace(max_delay=5)`` reads as it did. A runner named after a
    hardware (any key of ``HARDWARE``) stands for it and its GRES type when the node states none.
    """
    out = dict(data)
    for group, model in GROUPS.items():
        moved = {name: out.pop(name) for name in model.model_fields if name in out}
        if not moved:
            continue
        base = out.get(group)
        if isinstance(base, BaseModel):
            base = base.model_dump()
        if base is None:
            out[group] = moved
        elif isinstance(base, dict):
            out[group] = {**base, **moved}
        # anything else stays as given, for the group's own check to name
    node = out.get("node")
    runner = out.get("runner")
    if runner in HARDWARE and (node is None or (isinstance(node, dict) and "hardware" not in node)):
        node = node or {}
        out["node"] = {**node, "hardware": runner, "gres_type": node.get("gres_type", runner)}
    return out


def flat_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """A cell's JSON fields on one level (schema 1's layout): each group's fields at the top, engine_env
    as its sorted JSON text, no schema_version. For a cell as written, typed or not (a cell.json whose
    cell does not parse keeps what it says); a cell of schema 1 comes back as it is."""
    out: dict[str, Any] = {}
    for name, value in data.items():
        if name in GROUPS and isinstance(value, Mapping):
            out.update(value)
        elif name == "engine_env" and isinstance(value, Mapping):
            out[name] = json.dumps(dict(value), sort_keys=True, separators=(",", ":"))
        elif name != "schema_version":
            out[name] = value
    return out


# Base order makes the fields read axes, then engine settings (pydantic lists the fields of the last
# base first), then the groups.
class Cell(EngineSettings, CellAxes):
    """One benchmark cell: a GitHub matrix ``include`` item, and the input of every later part."""

    node: RunnerFacts = Field(default_factory=RunnerFacts)
    replay: ReplayOptions = Field(default_factory=ReplayOptions)
    limits: ValidityLimits = Field(default_factory=ValidityLimits)
    schema_version: Literal[2] = CELL_SCHEMA

    @model_validator(mode="before")
    @classmethod
    def _groups(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return lift_schema_1(data)

    @model_validator(mode="wrap")
    @classmethod
    def _node_size(cls, data: Any, handler: ModelWrapValidatorHandler[Cell]) -> Cell:
        """A hand-made cell's node (gpus_per_node 0): all of the cell's GPUs on one node, else as few
        per node as pack its instances onto its nodes."""
        cell = handler(data)
        if cell.node.gpus_per_node:
            return cell
        size = smallest_node(cell.instance_tps, cell.nodes, cell.gpus)
        node = cell.node.model_copy(update={"gpus_per_node": size})
        return handler({**dict(cell), "node": node})

    @model_validator(mode="after")
    def _preset_duration(self) -> Cell:
        problem = preset_duration_error(self.replay.preset, self.duration)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _one_digest(self) -> Cell:
        """An image written with its digest is pinned to that digest and no other."""
        written = self.image.partition("@")[2]
        if written and self.image_digest and written != self.image_digest:
            raise ValueError(
                f"image_digest {self.image_digest} differs from the digest in image {self.image}"
            )
        return self

    @model_validator(mode="after")
    def _true_label(self) -> Cell:
        """The engine runs with the settings the cell's fields say: engine_args and engine_env may add
        settings, never contradict a field (agentsweep.contract.engine_args)."""
        problem = engine_args_conflict(self)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _virtual_clock(self) -> Cell:
        """The virtual clock runs the simulated engine (one, or replicas behind a router it runs itself)
        and one replayer in one process, nothing else."""
        if self.clock != "virtual":
            return self
        if not self.simulated:
            raise ValueError(
                f"clock: virtual runs the simulated engine only (engine: {SIMULATED_ENGINE}), not {self.engine}"
            )
        shape = [
            (
                self.router not in ("", *VIRTUAL_ROUTER_POLICIES),
                f"router: {self.router} (the router program's own state)",
            ),
            (self.disaggregated, "disaggregated prefill/decode"),
            (self.client_nodes > 1, "client_nodes > 1"),
            (self.client != "replay", f"client {self.client}"),
            (self.accuracy.run == "on", "accuracy: on (the gate talks HTTP to the engine)"),
        ]
        refused = [what for hit, what in shape if hit]
        if refused:
            raise ValueError(
                f"clock: virtual runs the simulated engine (one, or replicas routed by "
                f"{', '.join(VIRTUAL_ROUTER_POLICIES)}) and one replayer; {refused[0]} needs clock: wall"
            )
        return self

    @property
    def simulated(self) -> bool:
        """True when the simulated engine stands in for the cell's hardware."""
        return self.engine == SIMULATED_ENGINE

    @property
    def hardware_label(self) -> str:
        """``simulated B300``, ``B200``...: what the cell ran on (see ``hardware_label``)."""
        return hardware_label(self.simulated, self.node.hardware, self.runner)

    @property
    def kv_transfer_gbs(self) -> float | None:
        """The KV transfer bandwidth per GPU of a disaggregated cell: ``intra_node_gbs`` on one node,
        ``inter_node_gbs`` when the cell spans several; None for any other cell."""
        if not self.disaggregated:
            return None
        return self.node.inter_node_gbs if self.nodes > 1 else self.node.intra_node_gbs

    def to_json(self) -> str:
        """The cell as one compact JSON object (field order kept)."""
        return self.model_dump_json()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def flat(self) -> dict[str, Any]:
        """The cell as one level of JSON values, in ``FLAT_FIELDS`` order (see ``flat_fields``).

        summary.csv's cell columns and the recipe fingerprint are this rendering, so they read as they
        did before the nesting and a recipe keeps its fingerprint.
        """
        dumped = flat_fields(self.model_dump(mode="json"))
        return {name: dumped[name] for name in FLAT_FIELDS}

    def replace(self, **changes: Any) -> Cell:
        """A copy with ``changes``, validated like any cell (``InputError`` when one is bad). A group's
        field may be named on its own (``max_delay=5``) or the group whole (``replay=...``)."""
        return type(self).parse({**self.model_dump(), **changes})

    @classmethod
    def parse(cls, data: str | bytes | dict[str, Any], where: str = "cell") -> Cell:
        """A cell from its JSON text or object; a bad one is an ``InputError`` naming ``where.field``."""
        try:
            if isinstance(data, dict):
                return cls.model_validate(data)
            return cls.model_validate_json(data)
        except ValidationError as err:
            field, what = validation_message(err, cls)
            if err.errors()[0]["type"] == "json_invalid":
                what = f"not a JSON object ({what})"
            raise InputError(f"{where}.{field}: {what}" if field else f"{where}: {what}") from None

    @classmethod
    def load(cls, arg: str, where: str = "--cell") -> Cell:
        """``--cell`` forms: the JSON itself, or ``@FILE`` holding it."""
        if arg.startswith("@"):
            path = Path(arg[1:])
            try:  # a FIFO or a device is refused, never opened and waited on
                text = read_limited(path, CELL_FILE_MAX_BYTES).decode("utf-8")
            except InputFileProblem as err:
                raise InputError(f"{where} {arg}: {err}") from None
            except UnicodeDecodeError as err:
                raise InputError(f"{where} {arg}: cannot read ({err})") from None
            return cls.parse(text, where=f"{path}")
        return cls.parse(arg, where=where)


def smallest_node(instance_tps: Sequence[int], nodes: int, gpus: int) -> int:
    """The fewest GPUs per node that hold ``instance_tps`` (packed in order) on ``nodes`` nodes; a
    one-node cell's node holds all its ``gpus``."""
    if nodes <= 1:
        return max(gpus, *instance_tps)
    size = max(instance_tps)
    while nodes_needed(instance_tps, size) > nodes:
        size += 1
    return size


# The cell's JSON keys, in order (a group is one key).
CELL_FIELDS: tuple[str, ...] = tuple(Cell.model_fields)
# The fields a config entry sets for all its cells (copied into each cell by the matrix generator).
ENTRY_FIELDS: tuple[str, ...] = tuple(EngineSettings.model_fields)
REPLAY_FIELDS: tuple[str, ...] = tuple(ReplayOptions.model_fields)
RUNNER_FACTS: tuple[str, ...] = tuple(RunnerFacts.model_fields)
VALIDITY_FIELDS: tuple[str, ...] = tuple(ValidityLimits.model_fields)
# ``Cell.flat``'s keys: the top-level fields, then each group's (summary.csv's cell columns).
FLAT_FIELDS: tuple[str, ...] = (
    *(f for f in CELL_FIELDS if f != "schema_version" and f not in GROUPS),
    *RUNNER_FACTS,
    *REPLAY_FIELDS,
    *VALIDITY_FIELDS,
)
