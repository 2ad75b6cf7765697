"""``hf:<org>/<dataset>``: fetch a dataset's trace files into the Hugging Face cache, return the folder.

Uses huggingface_hub (optional extra "hf"), imported only here. The cache location follows the usual
variables (HF_HUB_CACHE, HF_HOME), read when called. With HF_HUB_OFFLINE=1, or when the hub cannot be
reached, the cached snapshot is used.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from kv_cache_tester.errors import TraceError

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
PATTERNS = ["*.json", "*.jsonl", "*.json.gz", "*.jsonl.gz", "*.md", "LICENSE*"]


def hub_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home) / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hf_dataset_dir(repo_id: str) -> Path:
    """Local snapshot folder of dataset ``repo_id`` (downloaded when needed)."""
    shown = f"hf:{repo_id}"
    if not REPO_ID.match(repo_id):
        raise TraceError(f"{shown}: expected hf:<org>/<dataset>")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise TraceError(
            f"{shown}: reading a Hugging Face dataset needs huggingface_hub "
            "(pip install 'kv-cache-tester[hf]')"
        ) from None
    cache = hub_cache_dir()
    kwargs: dict[str, Any] = {
        "repo_id": repo_id,
        "repo_type": "dataset",
        "cache_dir": str(cache),
        "allow_patterns": PATTERNS,
    }
    first_error: Exception | None = None
    if not offline():
        try:
            return Path(snapshot_download(**kwargs))
        except Exception as err:  # network, auth, missing repo: fall back to the cache below
            first_error = err
    try:
        return Path(snapshot_download(**kwargs, local_files_only=True))
    except Exception as err:
        why = first_error or err
        raise TraceError(
            f"{shown}: not in the Hugging Face cache ({cache}) and not downloadable: "
            f"{type(why).__name__}: {str(why).splitlines()[0] if str(why) else ''}".rstrip(": ")
        ) from None
