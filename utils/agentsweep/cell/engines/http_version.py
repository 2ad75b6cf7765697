"""Ask a running engine for its version over HTTP (vLLM's /version, SGLang's /server_info)."""

from __future__ import annotations

import json
import urllib.request


def fetch_version(base_url: str, paths: tuple[str, ...], timeout_s: float = 3.0) -> str | None:
    """The first ``version`` any of ``paths`` reports as JSON, else None (never raises)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for path in paths:
        try:
            with opener.open(base_url + path, timeout=timeout_s) as resp:
                data = json.loads(resp.read())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("version"):
            return str(data["version"])
    return None
