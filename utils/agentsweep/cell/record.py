"""What a cell records of itself, whatever happened: its cell.json and status.txt (through their owner,
agentsweep.contract.resultdir), with every secret masked first."""

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

from agentsweep.contract.cell import Cell
from agentsweep.contract.resultdir import CellRecord, write_atomic, write_cell_result
from agentsweep.contract.resultdir.record import SCHEMA_VERSION
from agentsweep.contract.secrets import is_secret_flag, is_secret_name
from agentsweep.contract.verdict import VERDICTS, Verdict
from agentsweep.errors import InputError

MASK = "***"
VISIBLE_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# Values that are secrets whatever variable or flag carries them: Hugging Face, AWS access key ids,
# GitHub tokens, OpenAI-style keys.
TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{16,}|(?:AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{16,})"
)
# Shorter values of secret-named variables are not searched for inside other text (too many false hits).
MIN_SECRET_LEN = 6


def secret_values(environ: Mapping[str, str] | None = None) -> set[str]:
    """Values of the environment's secret-named variables (HF_TOKEN, *_API_KEY, ...), to mask anywhere."""
    env = os.environ if environ is None else environ
    return {v for k, v in env.items() if is_secret_name(k) and len(v.strip()) >= MIN_SECRET_LEN}


def token_values(text: str) -> list[str]:
    """The token-shaped substrings of ``text`` (for ``::add-mask::``), each once, in order."""
    return list(dict.fromkeys(m.group(0) for m in TOKEN_SHAPES.finditer(text)))


def mask_text(text: str, secrets: set[str] | None = None) -> str:
    """``text`` with token-shaped values and the environment's secret values replaced by ``***``."""
    values = secret_values() if secrets is None else secrets
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, MASK)
    return TOKEN_SHAPES.sub(MASK, text)


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """Values of variables whose name contains TOKEN, SECRET, KEY or PASSWORD become ``***``; secret
    values under any other name are masked too (see ``mask_text``)."""
    secrets = secret_values() | secret_values(env)
    return {k: (MASK if is_secret_name(k) else mask_text(v, secrets)) for k, v in env.items()}


def mask_argv(argv: Sequence[str], secrets: set[str] | None = None) -> list[str]:
    """Mask the value of secret-looking flags (``--api-key X`` and ``--api-key=X``) and secret values."""
    values = secret_values() if secrets is None else secrets
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
        out.append(mask_text(arg, values))
    return out


def mask_cell(cell: Mapping[str, Any]) -> dict[str, Any]:
    """The cell dict with secrets in engine_env / engine_args masked, and secret values anywhere."""
    out = dict(cell)
    raw_env = out.get("engine_env")
    env_secrets: set[str] = set()
    if isinstance(raw_env, str) and raw_env.strip():
        try:
            parsed = json.loads(raw_env)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            env = {str(k): str(v) for k, v in parsed.items()}
            env_secrets = secret_values(env)
            out["engine_env"] = json.dumps(mask_env(env), sort_keys=True)
    elif isinstance(raw_env, Mapping):
        env = {str(k): str(v) for k, v in raw_env.items()}
        env_secrets = secret_values(env)
        out["engine_env"] = mask_env(env)
    raw_args = out.get("engine_args")
    if isinstance(raw_args, str) and raw_args:
        with contextlib.suppress(ValueError):
            out["engine_args"] = shlex.join(mask_argv(shlex.split(raw_args)))
    masked: dict[str, Any] = _mask_strings(out, secret_values() | env_secrets)
    return masked


def _mask_strings(value: Any, secrets: set[str]) -> Any:
    if isinstance(value, str):
        return mask_text(value, secrets)
    if isinstance(value, Mapping):
        return {k: _mask_strings(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_strings(v, secrets) for v in value]
    return value


def visible_devices(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    return {k: environ[k] for k in VISIBLE_DEVICE_VARS if k in environ}


# Terminal escape sequences a reason may carry from a process's log (a router's coloured output):
# CSI (colours, cursor), OSC (titles, links, up to BEL or ST) and any other ESC + one character.
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?")
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def plain_line(text: str) -> str:
    """``text`` as one plain line: escape sequences removed, whitespace runs one space, any other
    control character ``?`` (a status reason is read in terminals, job summaries and reports)."""
    return CONTROLS.sub("?", " ".join(ESCAPES.sub("", text).split()))


def _hardware_label(cell: Mapping[str, Any]) -> str | None:
    """The cell's ``hardware_label`` ("simulated B300"), or None when the cell does not parse (a cell
    refused for bad input)."""
    try:
        return Cell.parse(dict(cell)).hardware_label
    except InputError:
        return None


def write_result(
    result_dir: Path,
    *,
    cell: Mapping[str, Any],
    engine_command: Sequence[str],
    engine_env: Mapping[str, str],
    replay_command: Sequence[str],
    versions: Mapping[str, str | None],
    start_utc: str,
    status: Verdict,
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
    secrets = secret_values() | secret_values(engine_env)
    lines = tuple(line for r in reasons if (line := mask_text(plain_line(r), secrets)))
    if status != "SUCCESS":
        lines = lines or ("no reason given",)
    record = CellRecord(
        schema_version=SCHEMA_VERSION,
        hardware=_hardware_label(cell),
        cell=mask_cell(cell),
        engine_command=tuple(mask_argv(engine_command, secrets)),
        engine_env=mask_env(engine_env),
        replay_command=tuple(mask_argv(replay_command, secrets)),
        versions=dict(versions),
        visible_devices=visible_devices(),
        start_utc=start_utc,
        end_utc=end_utc or utc_now(),
        status=status,
        reason="; ".join(lines) or None,
        reasons=lines,
        **(extra or {}),
    )
    write_cell_result(result_dir, record)


__all__ = ["is_secret_flag", "is_secret_name", "write_atomic", "write_result"]
