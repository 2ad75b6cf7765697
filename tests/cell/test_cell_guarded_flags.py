"""Every flag the true-label check guards is one the pinned vLLM and SGLang parse (the table names real
flags, not guesses): each spelling, appended to a recipe's command line with a valid value, is taken by
the engine's own parser (scripts/engine_parsers/parse_argv.py in that engine's virtualenv)."""

from __future__ import annotations

import pytest
from agentsweep.cell.plan import plan_cell
from agentsweep.contract.cell import Cell
from agentsweep.contract.engine_args import SWITCH, given_flags, guarded_spellings

from .test_cell_engine_parsers import Line, engine_pythons, numbered, parse_with_engine

pytestmark = pytest.mark.engine_parsers

VALUES = {
    "--kv-transfer-config": '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
    "--kv-offloading-backend": "native",
    "--disaggregation-mode": "prefill",
    "--model": "org/Other",
    "--model-path": "org/Other",
    "--served-model-name": "alias",
    "--host": "0.0.0.0",
    "--uds": "/tmp/engine.sock",
}


def _lines(engine: str, tmp_path) -> list[Line]:
    cell = Cell(
        exp_name="guarded", engine=engine, model="org/Model", tp=1, users=1, offload="off",  # type: ignore[arg-type]
        duration=60, traces="t", image="i", hardware="h200", gres_type="h200",
    )  # fmt: skip
    base = numbered(plan_cell(cell, tmp_path, port="$PORT", environ={}).engine.argv)
    lines = []
    for spelling in guarded_spellings(engine):
        kind = next(g.flag.kind for g in given_flags(engine, f"{spelling} 1") if g.flag.spelling == spelling)
        words = [spelling] if kind == SWITCH else [spelling, VALUES.get(spelling, "1")]
        lines.append(Line(spelling, engine, [*base, *words], {}))
    return lines


def _unrecognized(error: str) -> list[str]:
    """The words an argparse error says it does not know (vLLM's serve also names a positional model
    that a --model flag displaced: that is not the flag being unknown)."""
    _head, sep, words = error.partition("unrecognized arguments:")
    return words.split() if sep else []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_guarded_flag_is_a_flag_of_the_pinned_engine(engine, tmp_path):
    _version, python = engine_pythons()[engine]
    lines = _lines(engine, tmp_path)
    result = parse_with_engine(python, engine, lines)
    refused = [
        f"{line.ident}: {outcome['error']}"
        for line, outcome in zip(lines, result["results"], strict=True)
        if not outcome["ok"] and line.ident in _unrecognized(outcome["error"] or "")
    ]
    assert refused == [], refused
