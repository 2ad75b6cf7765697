"""The package's own extras hold what its tests import: `pip install './kv-cache-tester[test]'` in a
fresh virtualenv is enough to collect and run `pytest kv-cache-tester`."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Import names whose distribution is named otherwise.
DISTRIBUTIONS = {"huggingface_hub": "huggingface-hub", "yaml": "pyyaml"}


def _requirement_name(text: str) -> tuple[str, list[str]]:
    """(distribution, extras) of a requirement such as ``kv-cache-tester[tokenizer,hf]`` or ``numpy>=1``."""
    match = re.match(r"^\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", text)
    assert match, text
    extras = [e.strip() for e in (match.group(2) or "").split(",") if e.strip()]
    return match.group(1).lower().replace("_", "-"), extras


def _installed_by(extra: str) -> set[str]:
    """Every distribution ``pip install '.[extra]'`` brings in, the package's own extras expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    own = project["name"]
    todo, seen, found = [extra], set(), {_requirement_name(r)[0] for r in project["dependencies"]}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in project["optional-dependencies"][name]:
            dist, extras = _requirement_name(requirement)
            if dist == own:
                todo += extras
            else:
                found.add(dist)
    return found


def _test_imports() -> dict[str, str]:
    """Top-level modules the tests import (not the standard library, not the package), with a file."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in ("kv_cache_tester", "__future__"):
                    found.setdefault(top, path.relative_to(ROOT).as_posix())
    return found


def test_the_test_extra_installs_every_module_the_tests_import() -> None:
    installed = _installed_by("test")
    missing = {
        module: where
        for module, where in _test_imports().items()
        if DISTRIBUTIONS.get(module, module.replace("_", "-")).lower() not in installed
    }
    assert missing == {}, f"add to [project.optional-dependencies] test: {missing}"
