"""JSON helpers: orjson when importable (faster), the standard library otherwise.

Both read strict JSON: the standard library's NaN and Infinity are refused, as orjson refuses them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

loads: Callable[[bytes | str], Any]
dumps: Callable[[Any], bytes]

try:  # optional speed-up
    import orjson

    loads = orjson.loads

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - exercised only without the optional extra

    def _no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    def loads(data: bytes | str) -> Any:
        return json.loads(data, parse_constant=_no_constant)

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
