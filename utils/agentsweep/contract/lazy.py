"""A package's re-exports imported when first used (PEP 562): a process that needs one light module of
a package (the power sampler: its spec and its CSV) does not pay for the heavy ones beside it (the
matrix cell's model, about 0.2 s of CPU in every process that imports it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any


def lazy_exports(
    package: str, names: Sequence[str], modules: Sequence[str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: a name of ``names`` (its ``__all__``) is taken, on first use,
    from the first of ``modules`` that has it (lightest first), and kept in the package's
    ``namespace``."""
    exported = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in exported:
            for module in modules:
                home = importlib.import_module(module)
                if hasattr(home, name):
                    value = getattr(home, name)
                    namespace[name] = value
                    return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
