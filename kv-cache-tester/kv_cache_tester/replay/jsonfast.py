"""JSON helpers: orjson when importable (faster), the standard library otherwise."""

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
    loads = json.loads

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
