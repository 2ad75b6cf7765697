"""A package's re-exports imported when first used (PEP 562): a process that needs one light module of
a package (the power sampler: its spec and its CSV) does not pay for the heavy ones beside it (the
matrix cell's model, about 0.2 s of CPU in every process that imports it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: each name of ``homes`` imported from its module on first use
    and kept in the package's ``namespace``."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    return __getattr__
