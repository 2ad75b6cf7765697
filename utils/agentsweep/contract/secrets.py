"""Which names hold secrets: environment variables (HF_TOKEN, *_API_KEY...) and command-line flags
(--api-key, --hf-token...). The cell's record masks their values (agentsweep.cell.record); the cell
contract never repeats one in an error message."""

from __future__ import annotations

import re

_SECRET = re.compile(r"TOKEN|SECRET|KEY|PASSWORD", re.IGNORECASE)
_SECRET_WORDS = {"key", "token", "secret", "password", "passwd"}
_NOT_SECRET = re.compile(r"(^|_)CONFIG_KEY$", re.IGNORECASE)  # a sweep's config key is a name, not a key


def is_secret_name(name: str) -> bool:
    """An environment variable whose value is a secret (its name says TOKEN, SECRET, KEY or PASSWORD)."""
    return bool(_SECRET.search(name)) and not _NOT_SECRET.search(name)


def is_secret_flag(flag: str) -> bool:
    """``--api-key``, ``--hf-token``, ``--password``: the flag's last word names a secret.

    Stricter than env names, so ``--enable-prompt-tokens-details`` is not taken for one.
    """
    words = re.split(r"[-_.]", flag.lstrip("-").lower())
    return words[-1] in _SECRET_WORDS
