"""Every recipe's command line, parsed by the real engine's own argument parser at the pinned version.

The command lines come from the cell's own planner (``plan_cell``, the dry run's path) for every cell
of every shipped vLLM and SGLang entry of configs/agentic.yaml, on each hardware (H200, B200, MI355X),
in each shape an instance can take: alone, a replica behind a router, a prefill and a decode
instance. Each engine's lines go to scripts/engine_parsers/parse_argv.py running in that engine's
virtualenv (``make test-engine-parsers`` builds them: scripts/engine_parsers/setup.sh), which parses
them without starting anything. A line the engine refuses fails the test with the recipe, the cell
and the engine's own message (the unknown flag).

Without the virtualenvs the test skips with one line; AGENTSWEEP_REQUIRE_ENGINE_PARSERS=1 turns that
into a failure (CI builds them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from agentsweep.cell.engines.vllm import offload_with_nixl
from agentsweep.cell.plan import plan_cell
from agentsweep.cell.port_allocation import DryRunPortAllocator
from agentsweep.config import load_runners, select_cells
from agentsweep.config.loader import read_config_file
from agentsweep.contract.cell import Cell
from agentsweep.contract.engine_args import SWITCH, given_flags, guarded_spellings
from agentsweep.errors import InputError

pytestmark = pytest.mark.engine_parsers

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "agentic.yaml"
SCRIPTS = REPO / "scripts" / "engine_parsers"
HARDWARE = ("h200", "b200", "mi355x")
SHAPES = ("single", "replicas", "pd")
PLACEHOLDER = re.compile(r"^\$[A-Z0-9_]*PORT$")


def _pinned() -> ModuleType:
    spec = importlib.util.spec_from_file_location("engine_parsers_pinned", SCRIPTS / "pinned.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parser_python(engine: str, version: str) -> Path:
    root = os.environ.get("ENGINE_PARSERS_DIR") or (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentsweep" / "engine-parsers"
    )
    return Path(root) / f"{engine}-{version}" / "bin" / "python"


@dataclass(frozen=True)
class Line:
    """One engine instance's command line and where it came from."""

    ident: str
    engine: str
    argv: list[str]
    env: dict[str, str]


def shaped(cell: Cell, shape: str) -> Cell:
    """The cell as one engine alone, as two replicas behind a router, or as one prefill + one decode."""
    if shape == "single":
        return cell
    base = {**cell.to_dict(), "gpus": 2 * cell.tp, "router": "round_robin"}
    if shape == "replicas":
        return Cell.parse({**base, "replicas": 2})
    return Cell.parse({**base, "prefill": {"tp": cell.tp}, "decode": {"tp": cell.tp}})


def numbered(words: list[str]) -> list[str]:
    """The dry run's port placeholders ($PORT, $PREFILL0_PORT...) as distinct port numbers."""
    ports: dict[str, str] = {}
    return [ports.setdefault(w, str(8100 + len(ports))) if PLACEHOLDER.match(w) else w for w in words]


def command_lines(tmp: Path) -> tuple[list[Line], list[str]]:
    """Every (engine instance) command line of the shipped entries, and the ones the recipes refuse."""
    runners = load_runners()
    lines: list[Line] = []
    refused: list[str] = []
    for key in read_config_file(CONFIG).entries:
        cells = select_cells(CONFIG, [key], runners=runners)
        if not cells or cells[0].engine not in ("vllm", "sglang"):
            continue
        for cell in cells:
            for hardware in HARDWARE:
                for shape in SHAPES:
                    where = (
                        f"{cell.engine} recipe, {hardware}, offload {cell.offload}, {shape}: {cell.exp_name}"
                    )
                    try:
                        on = shaped(cell, shape).replace(hardware=hardware, gres_type=hardware)
                        plan = plan_cell(on, tmp, ports=DryRunPortAllocator(), environ={})
                    except InputError as err:
                        refused.append(f"{where}: {err}")
                        continue
                    launches = [(r.name or "engine", r.engine) for r in plan.instances]
                    for name, launch in launches:
                        lines.append(
                            Line(f"{where} [{name}]", cell.engine, numbered(launch.argv), dict(launch.env))
                        )
    return lines, refused


def distinct(lines: list[Line]) -> dict[str, list[Line]]:
    """Lines grouped by what the engine sees (argv and environment): each group is parsed once."""
    groups: dict[str, list[Line]] = {}
    for line in lines:
        groups.setdefault(json.dumps([line.argv, sorted(line.env.items())]), []).append(line)
    return groups


def parse_with_engine(python: Path, engine: str, lines: list[Line]) -> dict[str, Any]:
    request = {
        "engine": engine,
        "lines": [{"id": str(i), "argv": ln.argv, "env": ln.env} for i, ln in enumerate(lines)],
    }
    proc = subprocess.run(
        [str(python), str(SCRIPTS / "parse_argv.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        pytest.fail(f"{engine} parser did not run ({python}): exit {proc.returncode}\n{tail}", pytrace=False)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def engine_pythons() -> dict[str, tuple[str, Path]]:
    versions = _pinned().pinned_versions(CONFIG)
    found = {e: (v, parser_python(e, v)) for e, v in versions.items()}
    missing = [f"{e} {v} ({p.parent.parent})" for e, (v, p) in found.items() if not p.exists()]
    if missing:
        line = f"engine parser virtualenvs missing: {', '.join(missing)}; run `make test-engine-parsers`"
        if os.environ.get("AGENTSWEEP_REQUIRE_ENGINE_PARSERS") == "1":
            pytest.fail(line + " (AGENTSWEEP_REQUIRE_ENGINE_PARSERS=1)", pytrace=False)
        pytest.skip(line)
    return found


def probes(engine: str, tmp: Path) -> list[Line]:
    """Two lines the engine must refuse: an unknown flag, and an unknown variable with its prefix."""
    cell = Cell(
        exp_name="probe",
        engine=engine,  # type: ignore[arg-type]
        model="org/Model",
        tp=1,
        users=1,
        offload="off",
        duration=60,
        traces="traces/",
        engine_args="--no-such-flag-anywhere 3",
    )
    plan = plan_cell(
        cell.replace(hardware="h200", gres_type="h200"), tmp, ports=DryRunPortAllocator(), environ={}
    )
    flag = Line("probe: unknown flag", engine, numbered(plan.engine.argv), dict(plan.engine.env))
    plan = plan_cell(
        cell.replace(engine_args="", hardware="h200", gres_type="h200"),
        tmp,
        ports=DryRunPortAllocator(),
        environ={},
    )
    variable = f"{engine.upper()}_NO_SUCH_VARIABLE"
    env = {**plan.engine.env, variable: "1"}
    lines = [flag, Line(f"probe: {variable}", engine, numbered(plan.engine.argv), env)]
    if engine == "vllm":  # a composed KV connector whose second child vLLM does not know
        config = offload_with_nixl("NoSuchOffloadConnector", 2**30)
        argv = [*numbered(plan.engine.argv), "--kv-transfer-config", json.dumps(config)]
        lines.append(Line("probe: unknown MultiConnector child", engine, argv, dict(plan.engine.env)))
    return lines


# A valid value for each guarded flag that takes one (anything else takes "1").
GUARDED_VALUES = {
    "--kv-transfer-config": '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
    "--kv-offloading-backend": "native",
    "--disaggregation-mode": "prefill",
    "--model": "org/Other",
    "--model-path": "org/Other",
    "--served-model-name": "alias",
    "--host": "0.0.0.0",
    "--uds": "/tmp/engine.sock",
}


def guarded_lines(engine: str, tmp: Path) -> list[Line]:
    """A recipe's command line with each flag the true-label check guards appended (with a valid value):
    the table must name flags the engine has, not guesses."""
    cell = Cell(
        exp_name="guarded", engine=engine, model="org/Model", tp=1, users=1, offload="off",  # type: ignore[arg-type]
        duration=60, traces="t", image="i", hardware="h200", gres_type="h200",
    )  # fmt: skip
    base = numbered(plan_cell(cell, tmp, ports=DryRunPortAllocator(), environ={}).engine.argv)
    lines = []
    for spelling in guarded_spellings(engine):
        kind = next(g.flag.kind for g in given_flags(engine, f"{spelling} 1") if g.flag.spelling == spelling)
        words = [spelling] if kind == SWITCH else [spelling, GUARDED_VALUES.get(spelling, "1")]
        lines.append(Line(spelling, engine, [*base, *words], {}))
    return lines


@dataclass
class Checked:
    """One engine's answer: its version, and per distinct line the lines it stands for and the verdict."""

    version: str
    pinned: str
    groups: list[list[Line]]
    outcomes: list[dict[str, Any]]
    probes: list[dict[str, Any]]
    guarded: list[tuple[Line, dict[str, Any]]]
    build_s: float
    parse_s: float


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Checked], list[str]]:
    """Every engine's parser run once over every distinct command line, the probes and the guarded
    flags (one engine process each: importing an engine costs about ten seconds of CPU)."""
    pythons = engine_pythons()
    tmp = tmp_path_factory.mktemp("engine-parsers")
    lines, refused = command_lines(tmp)
    out: dict[str, Checked] = {}
    for engine, (version, python) in sorted(pythons.items()):
        groups = list(distinct([ln for ln in lines if ln.engine == engine]).values())
        extra = probes(engine, tmp)
        flags = guarded_lines(engine, tmp)
        result = parse_with_engine(python, engine, [g[0] for g in groups] + extra + flags)
        outcomes = result["results"]
        ends = (len(groups), len(groups) + len(extra))
        out[engine] = Checked(
            result["version"], version, groups, outcomes[: ends[0]], outcomes[ends[0] : ends[1]],
            list(zip(flags, outcomes[ends[1] :], strict=True)), result["build_s"], result["parse_s"],
        )  # fmt: skip
    return out, refused


def test_every_recipe_command_line_parses_with_the_pinned_engine(
    checked: tuple[dict[str, Checked], list[str]],
) -> None:
    engines, refused = checked
    failures: list[str] = []
    report: list[str] = []
    for engine, c in engines.items():
        assert c.version == c.pinned, f"the {engine} parser virtualenv holds {c.version}, not {c.pinned}"
        for outcome, group in zip(c.outcomes, c.groups, strict=True):
            if not outcome["ok"]:
                also = f" (and {len(group) - 1} more lines like it)" if len(group) > 1 else ""
                failures.append(
                    f"{group[0].ident}{also}: {engine} {c.version} refuses it: {outcome['error']}"
                )
        built = sum(len(g) for g in c.groups)
        report.append(
            f"{engine} {c.version}: {len(c.groups)} distinct command lines checked ({built} built), "
            f"parser built in {c.build_s:.1f} s, all parsed in {c.parse_s:.1f} s"
        )
    print("\n" + "\n".join(report), file=sys.stderr)
    assert not failures, "\n".join(failures)
    assert all(c.groups for c in engines.values())
    # No shape is refused: vLLM prefill/decode with CPU offload composes the offloading connector with
    # NIXL, and those lines were among the ones parsed.
    assert not refused, refused
    composed = [g[0] for g in engines["vllm"].groups if "offload on, pd" in g[0].ident]
    assert composed and all("MultiConnector" in " ".join(ln.argv) for ln in composed)


def test_an_unknown_flag_variable_or_connector_is_named(
    checked: tuple[dict[str, Checked], list[str]],
) -> None:
    engines, _ = checked
    for engine, c in engines.items():
        flag, variable, *rest = c.probes
        assert not flag["ok"] and "--no-such-flag-anywhere" in flag["error"], (engine, flag)
        name = f"{engine.upper()}_NO_SUCH_VARIABLE"
        assert not variable["ok"] and name in variable["error"], (engine, variable)
        if engine == "vllm":
            (child,) = rest
            assert not child["ok"] and "connectors[1]" in child["error"], child
            assert "NoSuchOffloadConnector" in child["error"], child


def _unrecognized(error: str) -> list[str]:
    """The words an argparse error says it does not know (vLLM's serve also names a positional model
    that a --model flag displaced: that is not the flag being unknown)."""
    _head, sep, words = error.partition("unrecognized arguments:")
    return words.split() if sep else []


def test_every_guarded_flag_is_a_flag_of_the_pinned_engine(
    checked: tuple[dict[str, Checked], list[str]],
) -> None:
    """Every flag the true-label check guards is one the pinned vLLM and SGLang parse: each spelling,
    appended to a recipe's command line with a valid value, is taken by the engine's own parser."""
    engines, _ = checked
    assert set(engines) == {"vllm", "sglang"}
    for engine, c in engines.items():
        assert c.guarded, engine
        refused = [
            f"{engine} {line.ident}: {outcome['error']}"
            for line, outcome in c.guarded
            if not outcome["ok"] and line.ident in _unrecognized(outcome["error"] or "")
        ]
        assert refused == [], refused
