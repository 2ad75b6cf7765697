"""cell.json and status.txt: the provenance and verdict every cell leaves, whatever happened."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentsweep.contract.verdict import VERDICTS

SCHEMA_VERSION = 1
MASK = "***"
_SECRET = re.compile(r"TOKEN|SECRET|KEY|PASSWORD", re.IGNORECASE)
_SECRET_WORDS = {"key", "token", "secret", "password", "passwd"}
VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET.search(name))


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """Values of variables whose name contains TOKEN, SECRET, KEY or PASSWORD become ``***``."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def is_secret_flag(flag: str) -> bool:
    """``--api-key``, ``--hf-token``, ``--password``: the flag's last word names a secret.

    Stricter than env names, so ``--enable-prompt-tokens-details`` is not taken for one.
    """
    words = re.split(r"[-_.]", flag.lstrip("-").lower())
    return words[-1] in _SECRET_WORDS


def mask_argv(argv: Sequence[str]) -> list[str]:
    """Mask the value of secret-looking flags (``--api-key X`` and ``--api-key=X``)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if arg.startswith("-") and is_secret_flag(arg.split("=", 1)[0]):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + MASK)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def mask_cell(cell: Mapping[str, Any]) -> dict[str, Any]:
    """The cell dict with secrets in engine_env / engine_args masked."""
    out = dict(cell)
    raw_env = out.get("engine_env")
    if isinstance(raw_env, str) and raw_env.strip():
        try:
            parsed = json.loads(raw_env)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            out["engine_env"] = json.dumps(
                mask_env({str(k): str(v) for k, v in parsed.items()}), sort_keys=True
            )
    raw_args = out.get("engine_args")
    if isinstance(raw_args, str) and raw_args:
        with contextlib.suppress(ValueError):
            out["engine_args"] = shlex.join(mask_argv(shlex.split(raw_args)))
    return out


def visible_devices(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    return {k: environ[k] for k in VISIBLE_DEVICE_VARS if k in environ}


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_result(
    result_dir: Path,
    *,
    cell: Mapping[str, Any],
    engine_command: Sequence[str],
    engine_env: Mapping[str, str],
    replay_command: Sequence[str],
    versions: Mapping[str, str | None],
    start_utc: str,
    status: str,
    reasons: Sequence[str] = (),
    end_utc: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write cell.json then status.txt (status.txt last: its presence means the record is complete).

    status.txt is the verdict, then one line per reason (none for SUCCESS).
    """
    if status not in VERDICTS:
        raise ValueError(f"status must be one of {', '.join(VERDICTS)}, not {status!r}")
    if (status == "SUCCESS") != (not reasons):
        raise ValueError(f"{status} needs {'no' if status == 'SUCCESS' else 'at least one'} reason")
    lines = [" ".join(r.split()) for r in reasons]
    record = {
        "schema_version": SCHEMA_VERSION,
        "cell": mask_cell(cell),
        "engine_command": mask_argv(engine_command),
        "engine_env": mask_env(engine_env),
        "replay_command": list(replay_command),
        "versions": dict(versions),
        "visible_devices": visible_devices(),
        "start_utc": start_utc,
        "end_utc": end_utc or utc_now(),
        "status": status,
        "reason": "; ".join(lines) or None,
        "reasons": lines,
        **(extra or {}),
    }
    result_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(result_dir / "cell.json", json.dumps(record, indent=2) + "\n")
    write_atomic(result_dir / "status.txt", "".join(f"{line}\n" for line in [status, *lines]))


def read_status(result_dir: Path) -> tuple[str | None, str | None]:
    """(first line, reason) of a result directory's status.txt, (None, None) when absent."""
    try:
        lines = (result_dir / "status.txt").read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    first = lines[0].strip() if lines else ""
    reason = lines[1].strip() if len(lines) > 1 else None
    return first, reason
