"""The packages' layers: every import, at the top of a module or inside a function, points down (or
sideways within a package). A function-local import of a higher layer hides an upward dependency
just as well as a top-level one, so both count.

The floors, lowest first (docs/architecture.md draws them). An entry of KNOWN_DEBTS is an upward
import not yet moved; the test also fails when one of them is gone, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "utils" / "agentsweep"

FLOORS: tuple[tuple[str, ...], ...] = (
    ("kv_cache_tester",),
    ("agentsweep.errors", "agentsweep.watchdog", "agentsweep.style"),
    ("agentsweep.contract",),
    ("agentsweep.engine_sim", "agentsweep.metrics"),
    ("agentsweep.energy", "agentsweep.validity", "agentsweep.images", "agentsweep.accuracy"),
    ("agentsweep.virtual",),
    ("agentsweep.cell",),
    ("agentsweep.capacity", "agentsweep.calibrate"),
    ("agentsweep.config",),
    (
        "agentsweep.collect",
        "agentsweep.preflight",
        "agentsweep.sweep",
        "agentsweep.experimental",
        "agentsweep.planner",
    ),
    ("agentsweep.store", "agentsweep.export"),
    ("agentsweep.dashboard",),
    ("agentsweep.cli", "agentsweep.commands"),
)

# (importing package, imported package): upward imports still to be moved.
KNOWN_DEBTS: set[tuple[str, str]] = set()


def floor_of(module: str) -> tuple[int, str] | None:
    """(floor, package) of a dotted module name, None outside the table (the standard library...)."""
    for level, packages in enumerate(FLOORS):
        for package in packages:
            if module == package or module.startswith(package + "."):
                return level, package
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) of every import in the file, function-local ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
    return out


def upward_imports() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        own = floor_of(module_name(path))
        if own is None:
            continue
        for name, line in imports(path):
            target = floor_of(name)
            if target is None or target[1] == own[1]:
                continue
            if target[0] > own[0]:
                found.setdefault((own[1], target[1]), []).append(
                    f"{path.relative_to(ROOT)}:{line} imports {name}"
                )
    return found


def test_every_package_has_a_floor():
    packages = {module_name(p).split(".")[1] for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    for name in sorted(packages | modules):
        assert floor_of(f"agentsweep.{name}") is not None, f"agentsweep.{name} has no floor in FLOORS"


def test_imports_point_down():
    found = upward_imports()
    new = {pair: lines for pair, lines in found.items() if pair not in KNOWN_DEBTS}
    assert not new, "imports of a higher layer:\n" + "\n".join(
        line for lines in new.values() for line in lines
    )
    paid = KNOWN_DEBTS - set(found)
    assert not paid, f"no longer imported upward (take them off KNOWN_DEBTS): {sorted(paid)}"
