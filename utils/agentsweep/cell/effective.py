"""The settings an engine says it runs with, read from its own start-up log, against the cell's fields.

Every engine states its settings as it starts; the cell reads them from the head of each instance's
log once the instance is healthy, and a setting that contradicts the cell's label makes the cell
INVALID (``engine_settings``), whatever let it through (a vLLM ``--config`` file, an engine that
overrides a flag, a recipe bug). What each engine writes:

- vLLM: ``non-default args: {...}`` (the command line's values that differ from vLLM's defaults, a
  Python dict) and ``Initializing a V1 LLM engine (v...) with config: model='...', ...,
  tensor_parallel_size=N, pipeline_parallel_size=N, data_parallel_size=N, ...,
  served_model_name=..., enable_prefix_caching=True|False, ...`` (the engine's resolved config:
  prefix caching as the engine decided it, e.g. off for a model that cannot use it).
- SGLang: ``server_args=ServerArgs(model_path='...', ..., tp_size=N, ..., disable_radix_cache=...,
  enable_hierarchical_cache=..., ...)``.
- The simulated engine: ``[engine_sim] effective settings: {JSON}``.

Each is turned into the same names: model, served_model_name, tp, pp, dp, ep, prefix_caching,
kv_offload (whether a CPU KV tier is on), port, and for the simulated engine hardware and speed (and,
recorded but not judged, step-model coefficients set in place of its profile's). A name an engine does not state is not judged.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentsweep.contract.cell import Cell

# The most of a log's head read for the start-up lines, and the longest line kept whole.
HEAD_MAX_BYTES = 8 << 20
LINE_MAX_BYTES = 1 << 20

SIM_MARKER = "[engine_sim] effective settings: "
VLLM_ARGS_MARKER = "non-default args: "
VLLM_CONFIG = re.compile(r"Initializing a V1 LLM engine \(v[^)]*\) with config: (?P<config>.*)$")
SGLANG_ARGS = re.compile(r"server_args=ServerArgs\((?P<args>.*)\)\s*$")


@dataclass(frozen=True)
class Stated:
    """What one instance's log says it runs with, and where it said so."""

    settings: dict[str, Any]
    source: str  # "<log name>: <which line(s)>"

    def __post_init__(self) -> None:
        # Only plain JSON values are kept (a log's repr may hold anything): the rest as short text.
        for key, value in self.settings.items():
            if value is not None and not isinstance(value, str | int | float | bool):
                self.settings[key] = str(value)[:200]
            elif isinstance(value, str):
                self.settings[key] = value[:500]

    def to_record(self) -> dict[str, Any]:
        return {"source": self.source, "settings": self.settings}


def _lines(path: Path) -> Iterator[str]:
    """The lines of a log's head (at most HEAD_MAX_BYTES; a longer line is cut to LINE_MAX_BYTES)."""
    try:
        fh = path.open("rb")
    except OSError:
        return
    with fh:
        read = 0
        while read < HEAD_MAX_BYTES:
            line = fh.readline(LINE_MAX_BYTES)
            if not line:
                return
            read += len(line)
            yield line.decode("utf-8", "replace").rstrip("\r\n")


def _value(text: str) -> Any:
    """A value as a Python repr shows it; unparsable text stays text."""
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def _keyed(text: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` pairs of a repr like ``ServerArgs(a=1, b='x', ...)`` for the wanted keys."""
    out: dict[str, Any] = {}
    for key in keys:
        match = re.search(rf"(?<![A-Za-z0-9_]){key}=('(?:[^'\\]|\\.)*'|\[[^\]]*\]|[^,()\[\]]*)", text)
        if match:
            out[key] = _value(match.group(1))
    return out


def _dict_items(text: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The wanted keys of a Python dict repr; objects it cannot read are left out key by key."""
    try:
        whole = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        whole = None
    if isinstance(whole, dict):
        return {k: whole[k] for k in keys if k in whole}
    out: dict[str, Any] = {}
    for key in keys:
        match = re.search(rf"'{key}': ('(?:[^'\\]|\\.)*'|\[[^\]]*\]|[^,{{}}]*)", text)
        if match:
            out[key] = _value(match.group(1))
    return out


def _first_name(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return value[0] if value else None
    return value


def _vllm(lines: Iterator[str], name: str) -> Stated | None:
    args: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    for line in lines:
        if args is None and VLLM_ARGS_MARKER in line:
            args = _dict_items(
                line.split(VLLM_ARGS_MARKER, 1)[1],
                (
                    "model_tag", "model", "served_model_name", "port", "tensor_parallel_size",
                    "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel",
                    "enable_prefix_caching", "kv_offloading_size", "kv_offloading_backend",
                ),
            )  # fmt: skip
        found = VLLM_CONFIG.search(line) if config is None else None
        if found:
            config = _keyed(
                found["config"],
                (
                    "model", "served_model_name", "tensor_parallel_size", "pipeline_parallel_size",
                    "data_parallel_size", "enable_prefix_caching",
                ),
            )  # fmt: skip
        if args is not None and config is not None:
            break
    if args is None and config is None:
        return None
    args, config = args or {}, config or {}
    out: dict[str, Any] = {}
    model = config.get("model", args.get("model_tag", args.get("model")))
    if model is not None:
        out["model"] = model
    served = config.get("served_model_name", args.get("served_model_name"))
    if served is not None:
        out["served_model_name"] = _first_name(served)
    for ours, theirs, default in (
        ("tp", "tensor_parallel_size", 1),
        ("pp", "pipeline_parallel_size", 1),
        ("dp", "data_parallel_size", 1),
    ):
        out[ours] = config.get(theirs, args.get(theirs, default))
    if args:  # the command line's view: absent means vLLM's default
        out["expert_parallel"] = bool(args.get("enable_expert_parallel", False))
        size = args.get("kv_offloading_size")
        out["kv_offload"] = isinstance(size, int | float) and size > 0
        if "port" in args:
            out["port"] = args["port"]
    caching = config.get("enable_prefix_caching", args.get("enable_prefix_caching"))
    if isinstance(caching, bool):
        out["prefix_caching"] = caching
    which = " and ".join(w for w, got in (("non-default args", args), ("engine config", config)) if got)
    return Stated(out, f"{name}: {which}")


def _sglang(lines: Iterator[str], name: str) -> Stated | None:
    for line in lines:
        found = SGLANG_ARGS.search(line)
        if not found:
            continue
        args = _keyed(
            found["args"],
            (
                "model_path", "served_model_name", "port", "tp_size", "pp_size", "dp_size", "ep_size",
                "disable_radix_cache", "enable_hierarchical_cache",
            ),
        )  # fmt: skip
        out: dict[str, Any] = {}
        for ours, theirs in (
            ("model", "model_path"),
            ("served_model_name", "served_model_name"),
            ("port", "port"),
            ("tp", "tp_size"),
            ("pp", "pp_size"),
            ("dp", "dp_size"),
            ("ep", "ep_size"),
        ):
            if theirs in args:
                out[ours] = args[theirs]
        if isinstance(args.get("disable_radix_cache"), bool):
            out["prefix_caching"] = not args["disable_radix_cache"]
        if isinstance(args.get("enable_hierarchical_cache"), bool):
            out["kv_offload"] = args["enable_hierarchical_cache"]
        return Stated(out, f"{name}: server_args")
    return None


def _sim(lines: Iterator[str], name: str) -> Stated | None:
    for line in lines:
        if SIM_MARKER not in line:
            continue
        try:
            data = json.loads(line.split(SIM_MARKER, 1)[1])
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        out = {k: data[k] for k in SIM_KEYS if k in data}
        return Stated(out, f"{name}: effective settings")
    return None


SIM_KEYS = (
    "model", "served_model_name", "port", "tp", "ep", "prefix_caching", "kv_offload", "hardware", "speed",
    "step_coefficients",
)  # fmt: skip
READERS = {"vllm": _vllm, "sglang": _sglang, "sim": _sim}


def stated_settings(engine: str, log_path: Path) -> Stated | None:
    """What the engine's log says it runs with, or None when it says nothing this reader knows."""
    reader = READERS.get(engine)
    if reader is None:
        return None
    return reader(_lines(log_path), log_path.name)


def expected_settings(cell: Cell, tp: int, port: int | str) -> dict[str, Any]:
    """What an instance of ``tp`` GPUs on ``port`` must run with for ``cell``'s label to be true."""
    out: dict[str, Any] = {
        "model": cell.model,
        "served_model_name": cell.model,
        "tp": tp,
        "pp": 1,
        "dp": 1,
        "prefix_caching": cell.offload != "noprefix",
        "kv_offload": cell.offload == "on",
    }
    if isinstance(port, int):
        out["port"] = port
    if cell.engine == "vllm":
        out["expert_parallel"] = cell.ep > 1
    else:
        out["ep"] = cell.ep
    if cell.engine == "sim":
        out["hardware"] = cell.node.hardware
        out["speed"] = cell.speed
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(b, int) and isinstance(a, str) and a.strip().isdigit():
        return int(a) == b
    return bool(a == b)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def mismatches(expected: dict[str, Any], stated: Stated, who: str) -> list[str]:
    """One line per setting the engine states differently from the cell's label."""
    out = []
    for key, want in expected.items():
        if key not in stated.settings:
            continue
        got = stated.settings[key]
        if not _same(got, want):
            out.append(
                f"{who} runs with {key} {_shown(got)} but the cell says {_shown(want)} ({stated.source})"
            )
    return out
