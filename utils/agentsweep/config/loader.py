"""Read configs/*.yaml and configs/runners.yaml into the typed models, with one-line errors.

YAML is read with two deliberate departures from ``yaml.safe_load``: a key repeated inside one mapping
is an error (safe_load silently keeps the last one), and only ``true``/``false`` are booleans (YAML 1.1
would turn the offload mode ``on``/``off`` into True/False).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agentsweep.config.schema import (
    RunnerSpec,
    SearchPoint,
    SearchSpaceShapeError,
    SweepSpec,
    normalize_search_space,
)
from agentsweep.contract.errors import format_path, suggest, validation_message
from agentsweep.errors import ConfigError

DEFAULT_CONFIG = Path("configs") / "agentic.yaml"
DEFAULT_RUNNERS = Path("configs") / "runners.yaml"
RUNNERS_ENV = "AGENTSWEEP_RUNNERS"
_RUNNER_KEY = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_BOOL_TAG = "tag:yaml.org,2002:bool"


class _Loader(yaml.SafeLoader):
    """SafeLoader whose booleans are only true/false (YAML 1.2 core schema style)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def repo_root() -> Path | None:
    """The checkout this package runs from (editable install), else the first parent of cwd with configs/."""
    here = Path(__file__).resolve().parents[3]
    if (here / DEFAULT_RUNNERS).is_file():
        return here
    cwd = Path.cwd().resolve()
    for parent in (cwd, *cwd.parents):
        if (parent / DEFAULT_RUNNERS).is_file():
            return parent
    return None


def display_path(path: Path) -> str:
    """How a file is named in errors: relative to the current directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def resolve_config_path(path: str | Path | None) -> Path:
    """An explicit path as given; the default configs/agentic.yaml in cwd, then in the repo root."""
    if path is not None:
        return Path(path)
    candidates = [Path.cwd() / DEFAULT_CONFIG]
    root = repo_root()
    if root is not None:
        candidates.append(root / DEFAULT_CONFIG)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise ConfigError(f"{DEFAULT_CONFIG}: file not found (looked in {tried}); pass --config FILE")


def _check_duplicates(node: yaml.Node, path: list[str], seen: set[int]) -> str | None:
    """First repeated key in any mapping under `node`, as an error message, or None."""
    if id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                ident = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                where = ".".join([*path, key_node.value])
                if ident in first_line:
                    return (
                        f"{where}: duplicate key (first at line {first_line[ident]}, again at line {line}); "
                        "YAML would silently keep only the last one"
                    )
                first_line[ident] = line
                found = _check_duplicates(value_node, [*path, key_node.value], seen)
            else:
                found = _check_duplicates(value_node, path, seen)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _check_duplicates(item, [*path[:-1], f"{path[-1]}[{i}]"] if path else [f"[{i}]"], seen)
            if found:
                return found
    return None


def read_yaml(path: Path) -> Any:
    """Parse one YAML file strictly (duplicate keys rejected, only true/false are booleans)."""
    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{shown}: file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{shown}: cannot read ({err})") from None
    try:
        node = yaml.compose(text, Loader=_Loader)
        if node is not None:
            duplicate = _check_duplicates(node, [], set())
            if duplicate:
                raise ConfigError(f"{shown}:{duplicate}")
        return yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f"{mark.line + 1}" if mark else "?"
        problem = " ".join(str(err.problem or err.context or "syntax error").split())
        raise ConfigError(f"{shown}:{line}: invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{shown}: invalid YAML: {' '.join(str(err).split())}") from None


# ---------------------------------------------------------------------------------------------------
# runners.yaml


def runners_path(path: str | Path | None = None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get(RUNNERS_ENV)
    if env:
        return Path(env)
    root = repo_root()
    if root is None:
        raise ConfigError(f"{DEFAULT_RUNNERS}: file not found (set ${RUNNERS_ENV} or run inside the repo)")
    return root / DEFAULT_RUNNERS


def load_runners(path: str | Path | None = None) -> dict[str, RunnerSpec]:
    """All runner specs, by key. Default file: $AGENTSWEEP_RUNNERS, else configs/runners.yaml."""
    file = runners_path(path)
    shown = display_path(file)
    data = read_yaml(file)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{shown}: expected a mapping of runner keys (h200, b200, ...) at the top level")
    out: dict[str, RunnerSpec] = {}
    for key, raw in data.items():
        if not isinstance(key, str) or not _RUNNER_KEY.match(key):
            raise ConfigError(f"{shown}:{key}: runner keys must be lower-case [a-z0-9_-] names")
        if not isinstance(raw, dict):
            raise ConfigError(f"{shown}:{key}: expected a mapping of runner fields, got {raw!r}")
        try:
            out[key] = RunnerSpec.model_validate(raw)
        except ValidationError as err:
            where, what = validation_message(err, RunnerSpec)
            raise ConfigError(f"{shown}:{key}.{where}: {what}") from None
    return out


# ---------------------------------------------------------------------------------------------------
# sweep configs


@dataclass(frozen=True)
class ConfigFile:
    """A sweep config file: its path, how errors name it, and its raw entries by key (file order)."""

    path: Path
    shown: str
    entries: dict[str, Any]

    def keys(self) -> list[str]:
        return list(self.entries)


def hidden_key(key: str) -> bool:
    """Keys starting with '.' hold YAML anchors to reuse (`.defaults: &defaults`); they are not sweeps."""
    return key.startswith(".")


def read_config_file(path: str | Path | None) -> ConfigFile:
    file = resolve_config_path(path)
    shown = display_path(file)
    data = read_yaml(file)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{shown}: expected a mapping of config keys at the top level")
    entries: dict[str, Any] = {}
    for key, raw in data.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{shown}:{key!r}: config keys must be non-empty strings")
        if not hidden_key(key):
            entries[key] = raw
    if not entries:
        raise ConfigError(f"{shown}: no config keys (only hidden '.'-keys)")
    return ConfigFile(path=file, shown=shown, entries=entries)


def parse_entry(shown: str, key: str, raw: Any) -> SweepSpec:
    """Validate one raw entry; errors name `<file>:<key>.<field path>`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{shown}:{key}: expected a mapping of fields, got {raw!r}")
    labels: list[str] = []
    if "search_space" in raw:
        try:
            points = normalize_search_space(raw["search_space"])
        except SearchSpaceShapeError as err:
            where = format_path(["search_space", *err.path])
            raise ConfigError(f"{shown}:{key}.{where}: {err}") from None
        labels = [p.label if isinstance(p, SearchPoint) else p["label"] for p in points]
        raw = {**raw, "search_space": points}
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as err:
        where, what = validation_message(err, SweepSpec, labels)
        raise ConfigError(f"{shown}:{key}.{where}: {what}" if where else f"{shown}:{key}: {what}") from None
    spec._key = key
    spec._source = shown
    return spec


def load_sweep(path: str | Path | None, key: str) -> SweepSpec:
    """One config key of a sweep file, validated (runner facts are checked later, by expand)."""
    config = read_config_file(path)
    if key not in config.entries:
        raise ConfigError(f"{config.shown}:{key}: no such config key{suggest(key, config.entries)}")
    return parse_entry(config.shown, key, config.entries[key])


__all__ = [
    "ConfigFile",
    "load_runners",
    "load_sweep",
    "parse_entry",
    "read_config_file",
    "read_yaml",
    "repo_root",
    "resolve_config_path",
    "suggest",
]
