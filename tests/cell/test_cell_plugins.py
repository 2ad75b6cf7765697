"""Engines and load clients are plug-ins; the core never imports the experimental package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from agentsweep.cell.clients import CLIENTS, client
from agentsweep.cell.engines import RECIPES, recipe
from agentsweep.contract.cell import CLIENTS as CLIENT_NAMES
from agentsweep.contract.cell import ENGINES
from agentsweep.errors import InputError

REPO = Path(__file__).resolve().parents[2]
CORE = ("cell", "config", "collect", "sweep", "metrics", "contract")


def test_every_engine_and_client_of_the_contract_is_registered():
    assert set(RECIPES) == set(ENGINES)
    assert set(CLIENTS) == set(CLIENT_NAMES)
    for name in ENGINES:
        found = recipe(name)
        assert found.startup_margin_s > 0 and found.health_timeout_s > 0 and found.stop_grace_s > 0
    assert [recipe(name).simulated for name in ENGINES] == [name == "sim" for name in ENGINES]
    for name in CLIENT_NAMES:
        assert callable(client(name).command)


def test_an_unknown_name_is_one_line():
    with pytest.raises(InputError, match="no recipe for 'trt'"):
        recipe("trt")
    with pytest.raises(InputError, match="no load client 'locust'"):
        client("locust")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_core_never_imports_experimental():
    for part in CORE:
        for path in (REPO / "utils" / "agentsweep" / part).rglob("*.py"):
            bad = {n for n in _imports(path) if n.startswith("agentsweep.experimental")}
            assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_the_replayer_imports_nothing_from_agentsweep():
    for path in (REPO / "kv-cache-tester" / "kv_cache_tester").rglob("*.py"):
        bad = {n for n in _imports(path) if n.split(".")[0] == "agentsweep"}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def _module_graph() -> dict[str, set[str]]:
    """agentsweep's modules and the agentsweep modules each imports (anywhere in it, lazily too)."""
    root = REPO / "utils"
    paths = {}
    for path in (root / "agentsweep").rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        paths[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {alias.name for alias in node.names if alias.name in paths}
            elif isinstance(node, ast.ImportFrom) and node.module:
                deps |= {node.module} & paths.keys()
                deps |= {f"{node.module}.{alias.name}" for alias in node.names} & paths.keys()
        graph[name] = deps - {name}
    return graph


def test_no_module_imports_back_into_one_that_imports_it():
    graph = _module_graph()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            raise AssertionError("import circle: " + " -> ".join(cycle))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*path, name])
        done.add(name)

    assert "agentsweep.cell.executor" in graph["agentsweep.cell.lifecycle"]  # the graph sees imports
    for name in sorted(graph):
        visit(name, [])
