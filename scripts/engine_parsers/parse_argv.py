"""Parse engine command lines with the engine's own argument parser, without starting the engine.

Runs inside an engine's virtualenv (scripts/engine_parsers/setup.sh), never in the project's: it
imports only the engine and the standard library. Reads one JSON object on stdin::

    {"engine": "vllm" | "sglang", "lines": [{"id": "...", "argv": [...], "env": {...}}, ...]}

and writes one JSON object on stdout: the engine's installed version, the seconds spent building the
parser and parsing, and per line ``{"id", "ok", "error"}``. A line fails when the parser rejects it
(an unknown flag, a bad value: argparse's own message), when the engine's own conversion of the
parsed arguments into its settings object refuses them, or when its environment names a variable
with the engine's prefix that this version does not define.

- vLLM: the ``vllm serve`` subcommand's parser (the one ``vllm serve`` builds), then the engine
  arguments made from it. vLLM infers its platform while building the parser; this machine has no
  GPU, so it is told to take the CPU platform (``VLLM_TARGET_DEVICE=cpu``): the flags and values
  the parser accepts do not depend on it. A ``MultiConnector`` KV transfer config is checked one
  level further, as vLLM reads it when the engine starts: every child must be a valid
  ``KVTransferConfig`` naming a connector vLLM's connector factory knows.
- SGLang: ``ServerArgs.add_cli_args`` on a fresh parser and ``parse_args`` (what
  ``sglang.launch_server`` does through ``prepare_server_args``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

# (engine name, distribution) -> words before the engine's own arguments in the recipe's argv.
VLLM_PREFIXES = (["vllm", "serve"], ["-m", "vllm.entrypoints.cli.main", "serve"])
SGLANG_PREFIX = ["-m", "sglang.launch_server"]


def _strip(argv: list[str], prefixes: tuple[list[str], ...]) -> list[str]:
    """The words after the first occurrence of one of ``prefixes`` (the engine's own arguments)."""
    for prefix in prefixes:
        for i in range(len(argv) - len(prefix) + 1):
            if argv[i : i + len(prefix)] == prefix:
                return argv[i + len(prefix) :]
    raise ValueError(f"not a command line of this engine: {' '.join(argv[:4])} ...")


def _parse(parse: Callable[[list[str]], Any], words: list[str]) -> tuple[Any, str | None]:
    """(parsed, None), or (None, argparse's message) when the parser rejects ``words``."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parse(words), None
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
        return None, (lines[-1].split("error:", 1)[1].strip() if lines else err.getvalue().strip()[-300:])


def _vllm() -> tuple[Callable[[dict[str, Any]], str | None], str]:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm import envs
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    known_env = set(envs.environment_variables)

    def check(line: dict[str, Any]) -> str | None:
        words = ["serve", *_strip(line["argv"], VLLM_PREFIXES)]
        ns, error = _parse(parser.parse_args, words)
        if error:
            return error
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                args = EngineArgs.from_cli_args(ns)
        except Exception as exc:  # the engine's own refusal, whatever its class
            return f"EngineArgs.from_cli_args: {type(exc).__name__}: {exc}"
        error = _vllm_connectors(args.kv_transfer_config)
        if error:
            return error
        unknown = sorted(n for n in line.get("env", {}) if n.startswith("VLLM_") and n not in known_env)
        if unknown:
            return f"unknown environment variable(s): {', '.join(unknown)} (not in vllm.envs)"
        return None

    return check, importlib.metadata.version("vllm")


def _vllm_connectors(config: Any) -> str | None:
    """Why a MultiConnector config's children would not load (None when they would, or no such config)."""
    if config is None or config.kv_connector != "MultiConnector":
        return None
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    children = config.kv_connector_extra_config.get("connectors")
    if not children:
        return "MultiConnector: kv_connector_extra_config.connectors is empty"
    for i, child in enumerate(children):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                KVConnectorFactory.get_connector_class(KVTransferConfig(**child))
        except Exception as exc:  # the engine's own refusal, whatever its class
            return f"MultiConnector connectors[{i}]: {type(exc).__name__}: {exc}"
    return None


def _sglang() -> tuple[Callable[[dict[str, Any]], str | None], str]:
    from sglang.srt.environ import envs
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)

    def check(line: dict[str, Any]) -> str | None:
        _, error = _parse(parser.parse_args, _strip(line["argv"], (SGLANG_PREFIX,)))
        if error:
            return error
        unknown = sorted(n for n in line.get("env", {}) if n.startswith("SGLANG_") and not hasattr(envs, n))
        if unknown:
            return f"unknown environment variable(s): {', '.join(unknown)} (not in sglang.srt.environ)"
        return None

    return check, importlib.metadata.version("sglang")


def main() -> int:
    request = json.load(sys.stdin)
    start = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):  # engines log while importing
        check, version = {"vllm": _vllm, "sglang": _sglang}[request["engine"]]()
    built = time.monotonic()
    results = []
    for line in request["lines"]:
        try:
            error = check(line)
        except ValueError as exc:
            error = str(exc)
        results.append({"id": line["id"], "ok": error is None, "error": error})
    out = {
        "engine": request["engine"],
        "version": version,
        "build_s": round(built - start, 2),
        "parse_s": round(time.monotonic() - built, 2),
        "results": results,
    }
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
