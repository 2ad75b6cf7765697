"""Read configs/*.yaml and configs/runners.yaml into the typed models, with one-line errors.

YAML is read with two deliberate departures from ``yaml.safe_load``: a key repeated inside one mapping
is an error (safe_load silently keeps the last one), and only ``true``/``false`` are booleans (YAML 1.1
would turn the offload mode ``on``/``off`` into True/False).

Input is bounded before anything looks at it: a regular file (never a FIFO or device) of at most
MAX_CONFIG_BYTES of UTF-8, nested at most MAX_YAML_DEPTH levels, expanding to at most MAX_YAML_VALUES
values once aliases are followed (an alias bomb is refused), with no control characters in keys or
values (tabs and line breaks only in values).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kv_cache_tester.inputfiles import InputFileProblem, describe_encoding, read_limited
from pydantic import ValidationError

from agentsweep.config.schema import (
    RunnerSpec,
    SearchPoint,
    SearchSpaceShapeError,
    SweepSpec,
    normalize_search_space,
)
from agentsweep.contract.errors import CONTROL, brief, format_path, key_text, suggest, validation_message
from agentsweep.contract.slo import SloError, check_unique, parse_tiers
from agentsweep.errors import ConfigError

DEFAULT_CONFIG = Path("configs") / "agentic.yaml"
DEFAULT_RUNNERS = Path("configs") / "runners.yaml"
RUNNERS_ENV = "AGENTSWEEP_RUNNERS"
_RUNNER_KEY = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_BOOL_TAG = "tag:yaml.org,2002:bool"
MAX_CONFIG_BYTES = 128 << 10  # 128 KiB: the shipped configs are a few KiB; the YAML parser is pure Python
MAX_YAML_DEPTH = 32  # levels of nesting, aliases followed; an entry needs about 6
MAX_KEY_LENGTH = 100  # a config key starts every exp_name; file names stop at 255 bytes
# A config key is a name, never a pattern or a list: selected by glob (`--key 'demo*'`), given in lists
# split on commas (the workflow's config_key input, its concurrency group), and starting every exp_name.
# A comma, a space, a glob character or a leading '-' in a key made it unselectable or made it share a
# concurrency group with the keys it split into, so such a key is refused ('.'-keys are hidden anchors).
CONFIG_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_YAML_VALUES = 100_000  # nodes once every alias is expanded (a 128 KiB file has fewer without them)
_CONTROL_IN_VALUE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class _Loader(yaml.SafeLoader):
    """SafeLoader whose booleans are only true/false (YAML 1.2 core schema style), nesting bounded."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # The composer recurses once per level: refuse deep nesting before Python's stack runs out.
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


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
    # abspath, not resolve: a symbolic link is named as given (a broken one has no target to show).
    try:
        return str(Path(os.path.abspath(path)).relative_to(os.getcwd()))
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


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_size(root: yaml.Node) -> str | None:
    """Refuse a node graph that is recursive, too deep, or too large once aliases are expanded.

    Iterative (no recursion), and each distinct node is visited once, so a billion-value alias bomb
    costs as much as its few lines of text.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        ident = id(node)
        line = node.start_mark.line + 1
        if finished:
            open_nodes.discard(ident)
            kids = _children(node)
            size[ident] = 1 + sum(size[id(k)] for k in kids)
            depth[ident] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[ident] > MAX_YAML_VALUES:
                return (
                    f"{line}: expands to more than {MAX_YAML_VALUES:,} values (aliases counted each "
                    "time they are used)"
                )
            if depth[ident] > MAX_YAML_DEPTH:
                return f"{line}: nested more than {MAX_YAML_DEPTH} levels deep (aliases followed)"
            continue
        if ident in size:
            continue
        if ident in open_nodes:
            return f"{line}: an alias refers to a node that contains it (a recursive structure)"
        open_nodes.add(ident)
        stack.append((node, True))
        stack.extend((kid, False) for kid in _children(node) if id(kid) not in size)
    return None


def _check_nodes(node: yaml.Node, path: list[str], seen: set[int]) -> str | None:
    """First repeated key or control character under `node`, as an error message, or None.

    Recursive, but only after _check_size has bounded the depth.
    """
    if id(node) in seen:
        return None
    seen.add(id(node))
    where = format_path(path) or "(top level)"
    if isinstance(node, yaml.ScalarNode):
        bad = _CONTROL_IN_VALUE.search(node.value)
        if bad:
            return (
                f"{where}: control character {bad.group()!r} in {brief(node.value)} "
                f"(line {node.start_mark.line + 1}); remove it"
            )
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                ident = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                name = key_text(key_node.value)
                bad = CONTROL.search(key_node.value)
                if bad:
                    return f"{format_path([*path, name])}: control character {bad.group()!r} in a key (line {line})"
                if ident in first_line:
                    return (
                        f"{format_path([*path, name])}: duplicate key (first at line {first_line[ident]}, "
                        f"again at line {line}); YAML would silently keep only the last one"
                    )
                first_line[ident] = line
                found = _check_nodes(value_node, [*path, name], seen)
            else:
                found = _check_nodes(key_node, path, seen) or _check_nodes(value_node, path, seen)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _check_nodes(item, [*path, f"[{i}]"], seen)
            if found:
                return found
    return None


def read_yaml(path: Path) -> Any:
    """Parse one YAML file strictly (bounded, duplicate keys rejected, only true/false are booleans)."""
    shown = display_path(path)
    try:
        data = read_limited(path, MAX_CONFIG_BYTES)
    except InputFileProblem as err:
        raise ConfigError(f"{shown}: {err}") from None
    encoding = describe_encoding(data[:4])
    if encoding:
        raise ConfigError(f"{shown}: the file is {encoding} text; save it as UTF-8")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{shown}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); save it as UTF-8"
        ) from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        problem = _check_size(node) or _check_nodes(node, [], set())
        if problem:
            raise ConfigError(f"{shown}:{problem}")
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f"{mark.line + 1}" if mark else "?"
        problem = " ".join(str(err.problem or err.context or "syntax error").split())
        raise ConfigError(f"{shown}:{line}: invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{shown}: invalid YAML: {' '.join(str(err).split())}") from None
    finally:
        loader.dispose()


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
        if isinstance(key, str) and hidden_key(key):
            continue  # YAML anchors to reuse, as in sweep configs
        if not isinstance(key, str) or not _RUNNER_KEY.match(key):
            raise ConfigError(f"{shown}:{brief(key)}: runner keys must be lower-case [a-z0-9_-] names")
        if not isinstance(raw, dict):
            raise ConfigError(f"{shown}:{key}: expected a mapping of runner fields, got {brief(raw)}")
        try:
            out[key] = RunnerSpec.model_validate(raw).named(key)
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
            raise ConfigError(f"{shown}:{brief(key)}: config keys must be non-empty strings")
        if len(key) > MAX_KEY_LENGTH:
            raise ConfigError(
                f"{shown}:{brief(key)}: config keys are at most {MAX_KEY_LENGTH} characters "
                "(each cell's exp_name, a file and artifact name, starts with it)"
            )
        if not hidden_key(key):
            if not CONFIG_KEY.match(key):
                raise ConfigError(
                    f"{shown}:{brief(key)}: a config key is letters, digits, '.', '_' and '-', starting with "
                    "a letter or digit (keys are selected by glob and listed with commas)"
                )
            entries[key] = raw
    if not entries:
        raise ConfigError(f"{shown}: no config keys (only hidden '.'-keys)")
    return ConfigFile(path=file, shown=shown, entries=entries)


_POINT_SEARCH = re.compile(r"^(search_space(?:\.[^.\[]+|\[\d+\]))\.search(?=$|[.\[])")


def parse_entry(shown: str, key: str, raw: Any) -> SweepSpec:
    """Validate one raw entry; errors name `<file>:<key>.<field path>`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{shown}:{key}: expected a mapping of fields, got {brief(raw)}")
    labels: list[str] = []
    if "search_space" in raw:
        try:
            points = normalize_search_space(raw["search_space"])
        except SearchSpaceShapeError as err:
            where = format_path(["search_space", *err.path])
            raise ConfigError(f"{shown}:{key}.{where}: {err}") from None
        labels = [p.label if isinstance(p, SearchPoint) else p["label"] for p in points]
        raw = {**raw, "search_space": points}
    if "slo" in raw:
        try:
            raw = {**raw, "slo": check_unique(parse_tiers(raw["slo"]))}
        except SloError as err:
            where = f"slo.{err.path}" if err.path else "slo"
            raise ConfigError(f"{shown}:{key}.{where}: {err}") from None
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as err:
        where, what = validation_message(err, SweepSpec, labels)
        # A point's search is written `users: {search: [LOW, HIGH], ...}`: name it so.
        where = _POINT_SEARCH.sub(r"\1.users", where)
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
