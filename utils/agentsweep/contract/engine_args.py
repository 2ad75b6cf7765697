"""Engine arguments and environment that contradict a cell's own fields (a label must stay true).

A cell's recipe starts its engine from the cell's fields (TP, EP, offload mode, hardware, speed,
model, ports); ``engine_args`` and ``engine_env`` come after the recipe and could change any of them
while the cell keeps its label. ``engine_args_conflict`` finds the first argument or variable that
sets one of those settings to something other than what the cell says, and names both; arguments
that only add settings (``--max-model-len``, ``--kv-cache-dtype``...) stay free.

Flags are read as the engines' own argument parsers read them: ``--flag value`` and ``--flag=value``,
underscores for dashes (vLLM), ``--flag.key`` for a JSON field of ``--flag`` (vLLM), a long flag
abbreviated to any prefix (argparse's default, which vLLM, SGLang and the simulated engine keep),
a short flag with its value attached (``-tp8``). A setting the cell decides whole (its ports, its
KV offload budget, its prefill/decode role, its GPUs) is refused whatever its value.

The cell model (``agentsweep.contract.cell.Cell``) refuses a conflicting cell; the matrix names the
config entry and the search point it came from.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agentsweep.contract.hardware import is_amd

# Values of a boolean environment variable that switch it on (as vLLM's envs.py reads them).
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


class NodeView(Protocol):
    """The runner's facts the check reads (``RunnerFacts`` has them)."""

    @property
    def hardware(self) -> str: ...


class CellView(Protocol):
    """The fields of a cell the check reads (``Cell`` has them all)."""

    @property
    def engine(self) -> str: ...
    @property
    def engine_args(self) -> str: ...
    @property
    def engine_env(self) -> Mapping[str, str]: ...
    @property
    def model(self) -> str: ...
    @property
    def tp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def offload(self) -> str: ...
    @property
    def offload_connector(self) -> str: ...
    @property
    def cpu_dram_gb(self) -> float: ...
    @property
    def node(self) -> NodeView: ...
    @property
    def speed(self) -> float: ...
    @property
    def instance_tps(self) -> list[int]: ...


# How a flag is read: no value (a switch), one value, or one or more values (nargs='+').
SWITCH, VALUE, VALUES = "switch", "value", "values"


class _Decides:
    """The cell decides this setting whole: any value given contradicts it."""

    def __repr__(self) -> str:
        return "decided by the cell"


DECIDES = _Decides()


@dataclass(frozen=True)
class Flag:
    """One spelling of a setting: how it is read, and the value it gives the setting."""

    spelling: str
    kind: str
    # The setting's value from the flag's value(s) (None for a switch) and the cell.
    value: Callable[[list[str], CellView], Any]


@dataclass(frozen=True)
class Setting:
    """An engine setting a cell field decides."""

    name: str  # how messages name the engine setting
    flags: tuple[Flag, ...]
    # The value the cell's fields give it, or DECIDES (then any given value contradicts).
    expected: Callable[[CellView], Any]
    # The cell's side of a contradiction, e.g. "tp 2".
    cell_side: Callable[[CellView], str]


def _int(values: list[str], _cell: CellView) -> Any:
    try:
        return int(values[0])
    except ValueError:
        return values[0]


def _float(values: list[str], _cell: CellView) -> Any:
    try:
        return float(values[0])
    except ValueError:
        return values[0]


def _first(values: list[str], _cell: CellView) -> Any:
    return values[0]


def _const(value: Any) -> Callable[[list[str], CellView], Any]:
    return lambda _values, _cell: value


def _tp_of_cell(cell: CellView) -> Any:
    tps = set(cell.instance_tps)
    return tps.pop() if len(tps) == 1 else DECIDES


def _tp_side(cell: CellView) -> str:
    tps = sorted(set(cell.instance_tps))
    if len(tps) == 1:
        return f"tp {tps[0]}"
    return f"tp of its instances ({', '.join(map(str, tps))})"


def _flags(kind: str, value: Callable[[list[str], CellView], Any], *spellings: str) -> tuple[Flag, ...]:
    return tuple(Flag(s, kind, value) for s in spellings)


def _prefix_on(cell: CellView) -> bool:
    return cell.offload != "noprefix"


def _prefix_side(cell: CellView) -> str:
    return f"offload {cell.offload} (prefix caching {'on' if _prefix_on(cell) else 'off'})"


def _offload_side(cell: CellView) -> str:
    if cell.offload == "on":
        return f"offload on with cpu_dram_gb {cell.cpu_dram_gb:g} (the recipe sizes the KV offload)"
    return f"offload {cell.offload} (no KV offload)"


def _one(_cell: CellView) -> int:
    return 1


def _one_group(cell: CellView) -> str:
    return f"{_tp_side(cell)} (each engine instance is one TP group of tp GPUs, nothing more)"


def _decides(_cell: CellView) -> Any:
    return DECIDES


def _ports_side(_cell: CellView) -> str:
    return "its ports and host (picked when it runs)"


def _model(cell: CellView) -> str:
    return cell.model


def _model_side(cell: CellView) -> str:
    return f"model {cell.model!r}"


def _served_side(cell: CellView) -> str:
    return f"model {cell.model!r} (the name its client asks for)"


def _hardware_side(cell: CellView) -> str:
    if cell.node.hardware:
        return f"hardware {cell.node.hardware} (its runner's)"
    return (
        "no hardware (its runner states none: the runner's entry in runners.yaml names the GPU it simulates)"
    )


def _ep_side(cell: CellView) -> str:
    return f"ep {cell.ep}"


def _tp(*spellings: str) -> Setting:
    return Setting("tensor parallelism", _flags(VALUE, _int, *spellings), _tp_of_cell, _tp_side)


def _pp(*spellings: str) -> Setting:
    return Setting("pipeline parallelism", _flags(VALUE, _int, *spellings), _one, _one_group)


def _dp(*spellings: str) -> Setting:
    return Setting("data parallelism", _flags(VALUE, _int, *spellings), _one, _one_group)


def _model_flags(*spellings: str) -> Setting:
    return Setting("the model", _flags(VALUE, _first, *spellings), _model, _model_side)


def _served(kind: str) -> Setting:
    return Setting("the served model name", _flags(kind, _first, "--served-model-name"), _model, _served_side)


def _ports(*spellings: str) -> Setting:
    return Setting("the port or host", _flags(VALUE, _first, *spellings), _decides, _ports_side)


def _prefix(on: tuple[str, ...], off: tuple[str, ...]) -> Setting:
    flags = (*_flags(SWITCH, _const(True), *on), *_flags(SWITCH, _const(False), *off))
    return Setting("prefix caching", flags, _prefix_on, _prefix_side)


def _offload(values: tuple[str, ...], switches: tuple[str, ...] = ()) -> Setting:
    flags = (*_flags(VALUE, _first, *values), *_flags(SWITCH, _const(True), *switches))
    return Setting("the KV offload", flags, _decides, _offload_side)


def _role(*spellings: str) -> Setting:
    return Setting(
        "the prefill/decode role",
        _flags(VALUE, _first, *spellings),
        _decides,
        lambda _c: "prefill/decode split and KV links (the cell and its runner decide them)",
    )


def _settings(engine: str) -> tuple[Setting, ...]:
    """The guarded settings of ``engine``'s command line."""
    if engine == "vllm":
        ep_flags = (
            *_flags(SWITCH, _const(True), "--enable-expert-parallel", "-ep"),
            *_flags(SWITCH, _const(False), "--no-enable-expert-parallel"),
        )
        return (
            _tp("--tensor-parallel-size", "-tp"),
            _pp("--pipeline-parallel-size", "-pp"),
            _dp("--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl"),
            Setting("expert parallelism", ep_flags, lambda cell: cell.ep > 1, _ep_side),
            _prefix(("--enable-prefix-caching",), ("--no-enable-prefix-caching",)),
            _offload(("--kv-offloading-size", "--kv-offloading-backend", "--kv-transfer-config")),
            _model_flags("--model"),
            _served(VALUES),
            _ports("--host", "--port", "--uds"),
        )
    if engine == "sglang":
        return (
            _tp("--tp-size", "--tp", "--tensor-parallel-size"),
            _pp("--pp-size", "--pipeline-parallel-size"),
            _dp("--dp-size", "--dp", "--data-parallel-size"),
            Setting(
                "expert parallelism",
                _flags(VALUE, _int, "--ep-size", "--ep", "--expert-parallel-size"),
                lambda cell: cell.ep,
                _ep_side,
            ),
            _prefix((), ("--disable-radix-cache",)),
            Setting(
                "the hierarchical (CPU) cache",
                _flags(SWITCH, _const(True), "--enable-hierarchical-cache"),
                lambda cell: cell.offload == "on",
                _offload_side,
            ),
            _offload(("--hicache-size", "--hicache-ratio")),
            _role("--disaggregation-mode", "--disaggregation-bootstrap-port"),
            _model_flags("--model-path", "--model"),
            _served(VALUE),
            _ports("--host", "--port"),
        )
    if engine == "sim":
        ep_flags = (
            Flag("--enable-expert-parallel", SWITCH, lambda _v, cell: cell.tp),
            *_flags(VALUE, _int, "--ep-size", "--expert-parallel-size"),
        )
        return (
            _tp("--tensor-parallel-size", "--tp-size", "--tp", "-tp"),
            Setting("expert parallelism", ep_flags, lambda cell: cell.ep, _ep_side),
            Setting(
                "the hardware profile",
                _flags(VALUE, _first, "--hardware"),
                lambda cell: cell.node.hardware,
                _hardware_side,
            ),
            Setting(
                "the simulated clock's speed",
                _flags(VALUE, _float, "--speed"),
                lambda cell: cell.speed,
                lambda cell: f"speed {cell.speed:g} (the client's time scale follows it)",
            ),
            _prefix(("--enable-prefix-caching",), ("--no-enable-prefix-caching", "--disable-radix-cache")),
            _offload(
                ("--kv-offloading-size", "--hicache-size", "--hicache-ratio"),
                ("--enable-hierarchical-cache",),
            ),
            _role("--disaggregation-mode", "--disaggregation-bootstrap-port", "--kv-transfer-gbs"),
            _model_flags("--model", "--model-path"),
            _served(VALUES),
            _ports("--host", "--port"),
        )
    return ()


@dataclass(frozen=True)
class EnvSetting:
    name: str
    variables: tuple[str, ...]
    expected: Callable[[CellView], Any]  # True/False for a switch, or DECIDES
    cell_side: Callable[[CellView], str]


def _env_settings(engine: str) -> tuple[EnvSetting, ...]:
    gpus = EnvSetting(
        "the GPUs it sees",
        ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
        _decides,
        lambda cell: f"{_tp_side(cell)} on the GPUs its allocation gives it",
    )
    if engine != "vllm":
        return (gpus,)
    return (
        gpus,
        EnvSetting(
            "the simple KV offload connector",
            ("VLLM_USE_SIMPLE_KV_OFFLOAD",),
            lambda cell: (
                cell.offload == "on" and cell.offload_connector == "simple" and not is_amd(cell.node.hardware)
            ),
            lambda cell: f"offload {cell.offload}, offload_connector {cell.offload_connector}",
        ),
        EnvSetting(
            "the NIXL handshake address",
            ("VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST"),
            _decides,
            _ports_side,
        ),
    )


@dataclass(frozen=True)
class _Given:
    """A guarded flag found in engine_args: its setting and flag, as written, and its value(s)."""

    setting: Setting
    flag: Flag
    shown: str
    values: list[str]


def _normalized(word: str) -> tuple[str, str | None]:
    """(flag name, attached value) of a word that starts with '-': underscores read as dashes in a
    long flag's name, ``--flag.key`` read as ``--flag``."""
    name, eq, value = word.partition("=")
    if name.startswith("--"):
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name, (value if eq else None)


def _match(name: str, attached: str | None, flags: Sequence[Flag]) -> tuple[Flag, str | None] | None:
    """The guarded flag ``name`` stands for, as an argument parser would read it, with any value
    attached to it; None when it is no guarded flag."""
    exact = [f for f in flags if f.spelling == name]
    if exact:
        return exact[0], attached
    if name.startswith("--") and len(name) > 3:
        prefixed = [f for f in flags if f.spelling.startswith("--") and f.spelling.startswith(name)]
        if prefixed:  # an abbreviation: argparse takes it when no other option starts so
            return prefixed[0], attached
    if not name.startswith("--") and attached is None:
        for f in flags:  # -tp8: a short flag with its value attached
            if not f.spelling.startswith("--") and f.kind != SWITCH and name.startswith(f.spelling):
                rest = name[len(f.spelling) :]
                if rest:
                    return f, rest
    return None


def given_flags(engine: str, engine_args: str) -> list[_Given]:
    """Every guarded flag in ``engine_args`` for ``engine``, in order."""
    try:
        words = shlex.split(engine_args)
    except ValueError:
        return []  # the cell's own check says what is wrong with the text
    settings = _settings(engine)
    flags = [(s, f) for s in settings for f in s.flags]
    found: list[_Given] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "--":
            continue
        name, attached = _normalized(word)
        hit = _match(name, attached, [f for _, f in flags])
        if hit is None:
            continue
        flag, value = hit
        setting = next(s for s, f in flags if f is flag)
        values: list[str] = []
        if flag.kind == SWITCH:
            pass
        elif value is not None:
            values = [value]
        else:
            while i < len(words) and not (words[i].startswith("-") and len(words[i]) > 1):
                values.append(words[i])
                i += 1
                if flag.kind == VALUE:
                    break
            if not values:
                continue  # no value: the engine's own parser refuses it
        shown = shlex.join([word, *([] if value is not None else values)])
        found.append(_Given(setting, flag, shown, values))
    return found


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return bool(a == b)


def _shown_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def engine_args_conflict(cell: CellView) -> str | None:
    """What in the cell's engine_args or engine_env contradicts one of its fields (one line naming
    both), or None."""
    for given in given_flags(cell.engine, cell.engine_args):
        setting = given.setting
        expected = setting.expected(cell)
        if expected is DECIDES:
            return (
                f"engine_args {given.shown!r} sets {setting.name}, but the cell decides it: "
                f"{setting.cell_side(cell)}"
            )
        value = given.flag.value(given.values, cell)
        if not _same(value, expected):
            return (
                f"engine_args {given.shown!r} sets {setting.name} to {_shown_value(value)}, but the cell says "
                f"{setting.cell_side(cell)}"
            )
    env = cell.engine_env
    for env_setting in _env_settings(cell.engine):
        for variable in env_setting.variables:
            if variable not in env:
                continue
            wanted = env_setting.expected(cell)
            side = env_setting.cell_side(cell)
            if wanted is DECIDES:
                return f"engine_env {variable} sets {env_setting.name}, but the cell decides it: {side}"
            switched = str(env[variable]).strip().lower() in TRUE_WORDS
            if switched != wanted:
                return (
                    f"engine_env {variable}={env[variable]} turns {env_setting.name} {_shown_value(switched)}, "
                    f"but the cell says {side}"
                )
    return None


def guarded_spellings(engine: str) -> list[str]:
    """Every flag spelling guarded for ``engine`` (docs and tests)."""
    return [f.spelling for s in _settings(engine) for f in s.flags]
