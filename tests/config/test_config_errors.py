"""Malformed configs: each gives exactly one expected error line on stderr and exit status 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

BASE = """\
k:
  runner: local
  engine: sim
  model: m
  precision: fp8
  duration: 10
  traces: t
{extra}  search_space:
{space}
"""
SPACE = "    tp1: {users: [1, 2]}"


def entry(extra: str = "", space: str = SPACE, replace: dict[str, str] | None = None) -> str:
    text = BASE.format(extra=textwrap.indent(textwrap.dedent(extra), "  ") if extra else "", space=space)
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)
    return text


E = "config error: bad.yaml:"
CASES: list[tuple[str, str, list[str], str]] = [
    ("unknown field", entry("duraton: 10\n"), [], E + "k.duraton: unknown field (did you mean 'duration'?)"),
    (
        "unknown runner",
        entry(replace={"runner: local": "runner: h20"}),
        [],
        E
        + "k.runner: unknown runner 'h20' (did you mean 'h200'?); runners.yaml has h200, b200, mi355x, local, "
        + "sim-h200, sim-b200, sim-b300, sim-gb200, sim-gb300, sim-mi325x, sim-mi355x",
    ),
    (
        "unknown engine",
        entry(replace={"engine: sim": "engine: vlm"}),
        [],
        E + "k.engine: 'vlm' is not one of vllm, sglang, sim (did you mean 'vllm'?)",
    ),
    (
        "unknown offload mode",
        entry(space="    tp1: {users: [1], offload: [on, of]}"),
        [],
        E + "k.search_space.tp1.offload[1]: 'of' is not one of on, off, noprefix (did you mean 'off'?)",
    ),
    (
        "zero users",
        entry(space="    tp1: {users: [0, 2]}"),
        [],
        E + "k.search_space.tp1.users[0]: must be > 0, got 0",
    ),
    (
        "negative users scalar",
        entry(space="    tp2: {users: -4}"),
        [],
        E + "k.search_space.tp2.users[0]: must be > 0, got -4",
    ),
    (
        "users not a number",
        entry(space="  - {tp: 1, users: [1, many]}"),
        [],
        E + "k.search_space[0].users[1]: expected an integer, got 'many'",
    ),
    (
        "GPUs above the node",
        entry(space="    tp16: {users: [1]}"),
        [],
        E + "k.search_space.tp16.tp: tp 16 needs 16 GPUs but runner 'local' has 8 per node",
    ),
    (
        "bad per-TP key",
        entry(space="    t4: {users: [1]}"),
        [],
        E + "k.search_space.t4: expected a key like tp4 (tp<N>, N >= 1)",
    ),
    ("missing field", entry(replace={"  model: m\n": ""}), [], E + "k.model: required field is missing"),
    (
        "unknown replay field",
        entry("replay: {max_dely: 5}\n"),
        [],
        E + "k.replay.max_dely: unknown field (did you mean 'max_delay'?)",
    ),
    (
        "unknown search-space field (list form)",
        entry(space="  - {tp: 1, users: [1], offlaod: [on]}"),
        [],
        E + "k.search_space[0].offlaod: unknown field (did you mean 'offload'?)",
    ),
    (
        "duplicate top-level key",
        entry() + "k:\n  runner: local\n",
        [],
        E
        + "k: duplicate key (first at line 1, again at line 10); YAML would silently keep only the last one",
    ),
    (
        "duplicate nested key",
        entry("duration: 20\n"),
        [],
        E
        + "k.duration: duplicate key (first at line 6, again at line 8); YAML would silently keep only the last one",
    ),
    ("key matches nothing", entry(), ["--key", "kk"], E + "kk: no config key matches (did you mean 'k'?)"),
    (
        "ep does not divide tp",
        entry(space="    tp2: {ep: 4, users: [1]}"),
        [],
        E + "k.search_space.tp2.ep: ep 4 must divide tp 2 (expert parallelism runs inside the TP group)",
    ),
    (
        "real engine without image",
        entry(replace={"engine: sim": "engine: vllm"}),
        [],
        E + "k.image: engine vllm needs a container image",
    ),
    (
        "speed on a real engine",
        entry("image: vllm/vllm-openai:v0.21.0\nspeed: 10\n", replace={"engine: sim": "engine: vllm"}),
        [],
        E + "k.speed: only the simulated engine (engine: sim) can run faster; vllm needs 1.0",
    ),
    (
        "advance_min above advance_max",
        entry("replay: {advance_min: 0.5, advance_max: 0.2}\n"),
        [],
        E + "k.replay: advance_min (0.5) must not exceed advance_max (0.2)",
    ),
    (
        "bad timing strategy",
        entry("replay: {timing_strategy: think}\n"),
        [],
        E
        + "k.replay.timing_strategy: 'think' is not one of think-only, original, api-scaled (did you mean 'think-only'?)",
    ),
    (
        "empty search space",
        entry(space="    {}").replace("search_space:\n    {}", "search_space: {}"),
        [],
        E + "k.search_space: must not be empty",
    ),
    (
        "search-space item not a mapping",
        entry(space="  - 4"),
        [],
        E + "k.search_space[0]: expected a mapping like {tp: 4, users: [1, 2]}, got 4",
    ),
    (
        "boolean env value",
        entry("engine_env: {FOO: true}\n"),
        [],
        E + "k.engine_env: FOO: value must be a string or a number (quote it), got True",
    ),
    (
        "duration is a boolean",
        entry(replace={"duration: 10": "duration: true"}),
        [],
        E + "k.duration: expected an integer, got True",
    ),
    (
        "too many cells",
        entry(
            space="    tp1: {users: ["
            + ", ".join(str(i) for i in range(1, 101))
            + "], offload: [on, off, noprefix]}"
        ),
        [],
        E
        + "k: 300 cells exceed GitHub's 256-job matrix limit; split the sweep by --offload (on: 100, off: 100, noprefix: 100)",
    ),
    (
        "top level not a mapping",
        "- k\n",
        [],
        "config error: bad.yaml: expected a mapping of config keys at the top level",
    ),
    (
        "invalid YAML",
        "k:\n  runner: [local\n  engine: sim\n",
        [],
        "config error: bad.yaml:3: invalid YAML: expected ',' or ']', but got ':'",
    ),
    (
        "tp given twice in the per-TP form",
        entry(space="    tp2: {tp: 2, users: [1]}"),
        [],
        E + "k.search_space.tp2.tp: the tp comes from the key; remove it here",
    ),
]


@pytest.mark.parametrize(("text", "argv", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_config_gives_one_line(
    cli, in_tmp: Path, text: str, argv: list[str], expected: str
) -> None:
    (in_tmp / "bad.yaml").write_text(text)
    result = cli("--config", "bad.yaml", *(argv or ["--key", "k"]), "--json")
    assert (result.rc, result.err, result.out) == (2, expected + "\n", "")


def test_at_least_fifteen_cases() -> None:
    assert len(CASES) >= 15


def test_offload_on_needs_a_dram_budget(cli, in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (in_tmp / "runners.yaml").write_text(
        "local:\n  runs_on: [x]\n  launcher: runners/launch_local.sh\n  gpus_per_node: 8\n"
        "  cpu_dram_gb: 0\n  container_runtime: none\n  hardware: h200\n"
    )
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", str(in_tmp / "runners.yaml"))
    (in_tmp / "bad.yaml").write_text(entry(space="    tp1: {users: [1], offload: [off, on]}"))
    result = cli("--config", "bad.yaml", "--key", "k")
    assert result.rc == 2
    assert result.err == (
        E
        + "k.search_space.tp1.offload: offload 'on' needs a CPU DRAM budget but runner 'local' has cpu_dram_gb 0\n"
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("  gpus_per_node: 0\n", "runners.yaml:local.gpus_per_node: must be > 0, got 0"),
        (
            "  gpus_per_node: 8\n  partiton: p\n",
            "runners.yaml:local.partiton: unknown field (did you mean 'partition'?)",
        ),
        (
            "  gpus_per_node: 8\n  container_runtime: podman\n",
            "runners.yaml:local.container_runtime: 'podman' is not one of pyxis, docker, none",
        ),
    ],
    ids=["zero gpus", "unknown field", "unknown runtime"],
)
def test_malformed_runners_file(
    cli, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, body: str, expected: str
) -> None:
    base = "local:\n  runs_on: [x]\n  launcher: runners/launch_local.sh\n  cpu_dram_gb: 8\n"
    if "container_runtime" not in body:
        body += "  container_runtime: none\n"
    (in_tmp / "runners.yaml").write_text(base + body)
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", "runners.yaml")
    (in_tmp / "ok.yaml").write_text(entry())
    result = cli("--config", "ok.yaml", "--key", "k")
    assert (result.rc, result.err) == (2, "config error: " + expected + "\n")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tp", "x"], "input error: --tp: 'x' is not a positive integer"),
        (["--users", "1,,2"], "input error: --users: empty item in '1,,2' (use a comma list like 1,2,4)"),
        (
            ["--offload", "of"],
            "input error: --offload: unknown mode 'of' (did you mean 'off'?); use on, off, noprefix",
        ),
        (["--tp", "4"], "input error: --tp 4: no cell of the selected keys has it (available: 1)"),
        (["--duration", "0"], "input error: --duration: '0' is not a positive integer"),
        (
            ["--max-tp", "1", "--tp", "1", "--users", "3"],
            "input error: --users 3: no cell of the selected keys has it (available: 1, 2)",
        ),
    ],
)
def test_bad_command_line_values(cli, in_tmp: Path, argv: list[str], expected: str) -> None:
    (in_tmp / "ok.yaml").write_text(entry())
    result = cli("--config", "ok.yaml", "--key", "k", *argv)
    assert (result.rc, result.err, result.out) == (2, expected + "\n", "")


def test_missing_config_file(cli, in_tmp: Path) -> None:
    result = cli("--config", "nope.yaml", "--key", "k")
    assert (result.rc, result.err) == (2, "config error: nope.yaml: file not found\n")
