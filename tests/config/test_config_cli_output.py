"""`agentsweep matrix` outputs: table and count, JSON round trip, GitHub output files, splitting hints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agentsweep.config import select_cells
from agentsweep.contract.cell import CELL_FIELDS, CELL_SCHEMA, GROUPS, Cell


def test_demo_table_has_every_cell_and_the_count(cli) -> None:
    result = cli("--key", "demo", "--table")
    assert result.rc == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].split()[:4] == ["exp_name", "runner", "engine", "model"]
    rows = [line for line in lines[2:] if line.startswith("demo-")]
    assert len(rows) == 18
    assert lines[-1].startswith("18 cells (demo: 18)")
    assert {row.split()[0] for row in rows} == {c.exp_name for c in select_cells(None, ["demo"])}


ROLES = ("prefill", "decode", "capacity")  # nested values: role shapes and a capacity search


def test_json_round_trips_into_the_github_matrix_shape(cli) -> None:
    result = cli("--key", "demo", "--json")
    assert result.rc == 0, result.err
    data = json.loads(result.out)
    assert list(data) == ["include"]
    cells = [Cell.parse(item) for item in data["include"]]
    assert cells == select_cells(None, ["demo"])
    for item in data["include"]:
        assert tuple(item) == CELL_FIELDS
        # Scalars, except a disaggregated cell's role shapes and a capacity cell's search (null here),
        # the accuracy gate's block (the demo's simulated cells keep the default: auto), the groups
        # (the runner's facts, the replay options, the validity limits) and engine_env.
        nested = (*ROLES, "accuracy", *GROUPS, "engine_env")
        assert all(isinstance(v, str | int | float | bool) for k, v in item.items() if k not in nested)
        assert all(item[k] is None for k in ROLES)
        assert item["accuracy"]["run"] == "auto" and item["accuracy"]["task"] == "gsm8k"
        assert item["schema_version"] == CELL_SCHEMA and item["engine_env"] == {}
        assert item["node"]["hardware"] == "h200" and item["replay"]["ignore_eos"] is True
        assert all(isinstance(v, str | int | float | bool) for g in GROUPS for v in item[g].values())
    assert json.loads(json.dumps([c.to_dict() for c in cells])) == data["include"]


def test_default_output_off_a_terminal_is_json(cli) -> None:
    result = cli("--key", "demo-mini")
    assert len(json.loads(result.out)["include"]) == 3


def test_json_round_trip() -> None:
    for cell in select_cells(None, ["demo", "dsr1-fp4-b200-vllm"]):
        text = cell.to_json()
        assert tuple(json.loads(text)) == CELL_FIELDS
        assert Cell.parse(text) == cell
    assert json.loads(select_cells(None, ["demo"])[0].to_json())["replay"]["ignore_eos"] is True


def test_github_output_writes_both_files(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, summary = tmp_path / "out", tmp_path / "summary.md"
    out.write_text("earlier=1\n")
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = cli("--key", "dsr1-fp4-b200-vllm", "--tp", "4", "--users", "1,2", "--github-output")
    assert result.rc == 0, result.err
    lines = out.read_text().splitlines()
    assert lines[0] == "earlier=1"  # appended, never truncated
    outputs = dict(line.split("=", 1) for line in lines[1:])
    matrix = json.loads(outputs["matrix"])
    assert [c["exp_name"] for c in matrix["include"]] == [
        f"dsr1-fp4-b200-vllm-tp4-ep4-u{u}-{m}" for u in (1, 2) for m in ("on", "off", "noprefix")
    ]
    assert outputs["count"] == "6"
    assert outputs["max_parallel"] == "4"
    assert outputs["keys"] == "dsr1-fp4-b200-vllm"
    text = summary.read_text()
    assert text.startswith("### Sweep matrix: 6 cells")
    assert text.count("| `dsr1-fp4-b200-vllm-tp4-") == 6
    assert "6 cells" in result.out  # the table goes to the log


def test_one_key_set_however_it_is_spelled(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `keys` output (the sweep workflow's concurrency group) names the keys the cells came from:
    globs, order, spaces and repeats of one set give one value; a long set is named by its digest."""
    from agentsweep.config.render import SWEEP_KEYS_MAX_CHARS, sweep_keys

    def keys(*args: str) -> str:
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        monkeypatch.setenv("GITHUB_OUTPUT", str(out))
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
        assert cli(*args, "--github-output").rc == 0
        return dict(line.split("=", 1) for line in out.read_text().splitlines())["keys"]

    spellings = [
        ("--key", "demo-mini", "--key", "demo"),
        ("--key", "demo", "--key", "demo-mini", "--key", "demo"),
        ("--key", " demo-mini ", "--key", "demo"),
        ("--key", "demo", "--key", "demo-m*"),
    ]
    assert {keys(*s) for s in spellings} == {"demo,demo-mini"}
    assert keys("--key", "demo") == "demo"
    many = select_cells(None, ["*"])
    named = sweep_keys(many)
    expected = ",".join(sorted({c.config_key for c in many}))
    assert named == (expected if len(expected) <= SWEEP_KEYS_MAX_CHARS else named)
    long = [c.model_copy(update={"config_key": f"k{i:03d}-" + "x" * 20}) for i, c in enumerate(many * 10)]
    digest = sweep_keys(long)
    assert digest.startswith("sha256-") and len(digest) == 23 and digest == sweep_keys(long[::-1])


def test_github_output_without_variables_prints_json_and_says_so(cli) -> None:
    result = cli("--key", "demo-mini", "--github-output")
    assert result.rc == 0
    assert len(json.loads(result.out)["include"]) == 3
    assert result.err == "note: $GITHUB_OUTPUT and $GITHUB_STEP_SUMMARY not set; printed the matrix instead\n"


def test_filters_and_overrides(cli) -> None:
    cells = select_cells(None, ["demo"], tp=[2], users=[4, 8], offload=["on"], duration=5)
    assert [(c.tp, c.users, c.offload, c.duration) for c in cells] == [(2, 4, "on", 5), (2, 8, "on", 5)]
    assert [c.tp for c in select_cells(None, ["llama70b-*"], max_tp=4)] == [2] * 18 + [4] * 21


def test_glob_keys_dedupe_and_keep_file_order() -> None:
    cells = select_cells(None, ["demo*", "demo"])
    assert [c.config_key for c in cells] == (
        ["demo"] * 18 + ["demo-mini"] * 3 + ["demo-capacity"] + ["demo-scaleout"] * 3
    )


def test_offload_budget_scales_with_gpus() -> None:
    cells = select_cells(None, ["llama70b-fp8-h200-vllm"], users=[1], offload=["on", "off"])
    budget = {(c.tp, c.offload): c.cpu_dram_gb for c in cells}
    # h200: 1536 GiB per 8-GPU node
    assert budget == {
        (2, "on"): 384.0,
        (2, "off"): 0.0,
        (4, "on"): 768.0,
        (4, "off"): 0.0,
        (8, "on"): 1536.0,
        (8, "off"): 0.0,
    }


def test_too_many_cells_names_the_split(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    users = ", ".join(str(u) for u in range(1, 51))
    body = (
        "  runner: local\n  engine: sim\n  model: m\n  precision: fp8\n  duration: 5\n  traces: t\n"
        f"  search_space:\n    tp1: {{users: [{users}], offload: [on, off, noprefix]}}\n"
        f"    tp2: {{users: [{users}], offload: [on, off]}}\n"
    )
    (tmp_path / "big.yaml").write_text("a:\n" + body + "b:\n" + body)
    result = cli("--config", "big.yaml", "--key", "*")
    assert result.rc == 2
    assert result.err == (
        "config error: big.yaml:*: 500 cells exceed GitHub's 256-job matrix limit; split the sweep "
        "by --key (a: 250, b: 250); by --tp (1: 300, 2: 200); by --offload (on: 200, off: 200, noprefix: 100)\n"
    )
    ok = cli("--config", "big.yaml", "--key", "a", "--offload", "on,off", "--json")
    assert ok.rc == 0 and len(json.loads(ok.out)["include"]) == 200
    assert len(select_cells("big.yaml", ["*"], max_cells=None)) == 500


def test_list_keys(cli) -> None:
    result = cli("--list")
    keys = [line.split()[0] for line in result.out.splitlines()]
    assert "demo" in keys and "demo-mini" in keys and not any(k.startswith(".") for k in keys)


def test_each_key_shows_every_key_as_its_own_matrix(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's dry run of a config file: a table per key, as `--key KEY --table` prints it, in one process."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    listed = [line.split()[0] for line in cli("--list").out.splitlines()]
    result = cli("--each-key")
    assert result.rc == 0 and result.err == "", result.err
    headers = [line for line in result.out.splitlines() if line.startswith("== ")]
    assert headers == [f"== configs/agentic.yaml: {key}" for key in listed]
    demo = result.out.split("== configs/agentic.yaml: demo\n", 1)[1].split("\n== ", 1)[0]
    assert demo.rstrip("\n") == cli("--key", "demo", "--table").out.rstrip("\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")  # a log group per key
    grouped = cli("--each-key").out.splitlines()
    assert (
        grouped.count("::endgroup::") == len(listed)
        and grouped[0] == f"::group::configs/agentic.yaml: {listed[0]}"
    )
    assert cli("--each-key", "--key", "demo").rc == 2


def test_each_key_names_every_bad_key_and_still_shows_the_good_ones(cli, in_tmp: Path) -> None:
    (in_tmp / "mixed.yaml").write_text(
        "bad:\n  runner: nowhere\n"
        "good:\n  runner: local\n  engine: sim\n  model: m\n  precision: fp8\n  duration: 5\n  traces: t\n"
        "  search_space:\n    tp1: {users: [2], offload: [on]}\n"
        "worse:\n  engine: sim\n"
    )
    result = cli("--config", "mixed.yaml", "--each-key")
    assert result.rc == 2
    assert "good-tp1-ep1-u2-on" in result.out and "== mixed.yaml: worse" in result.out
    errors = result.err.splitlines()
    assert errors[0].startswith("config error: mixed.yaml:bad.") and errors[1].startswith(
        "config error: mixed.yaml:worse."
    )
    assert errors[-1] == "config error: mixed.yaml: 2 of 3 keys are bad: bad, worse"


def test_no_key_is_an_error(cli) -> None:
    result = cli()
    assert (result.rc, result.err) == (
        2,
        "input error: give at least one --key (globs allowed; `agentsweep matrix --list` shows the keys)\n",
    )


@pytest.mark.integration
def test_default_config_found_from_the_repo_root(repo_root: Path, tmp_path: Path) -> None:
    # Outside the checkout, the default configs/agentic.yaml still resolves (to the repo's copy).
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "matrix", "--key", "demo-mini", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [c["offload"] for c in json.loads(proc.stdout)["include"]] == ["on", "off", "noprefix"]
    bad = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "matrix", "--key", "dmeo"],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (bad.returncode, bad.stderr) == (
        2,
        "config error: configs/agentic.yaml:dmeo: no config key matches (did you mean 'demo'?)\n",
    )


BODY = (
    "  runner: local\n  engine: sim\n  model: m\n  precision: fp8\n  duration: 5\n  traces: t\n"
    "  search_space: {tp1: {users: 1, offload: off}}\n"
)


def test_keys_that_differ_only_in_case_are_refused(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("a-b:\n" + BODY + "A-b:\n" + BODY)
    result = cli("--config", "c.yaml", "--key", "*")
    assert (result.rc, result.err) == (
        2,
        "config error: c.yaml:A-b: exp_name A-b-tp1-ep1-u1-off collides with a-b-tp1-ep1-u1-off of key "
        "'a-b' (keys differ only in letter case or in characters outside [A-Za-z0-9._-])\n",
    )


@pytest.mark.parametrize("key", ["a b", "a/b", "a,b", "[x]", "-dash", "a*", "x?", "é"])
def test_a_key_no_selection_could_name_exactly_is_refused(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """A comma split the key in the workflow's key list (sharing a concurrency group with the keys it
    split into), glob characters made --key match others, a leading '-' read as a flag: refused."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("ok:\n" + BODY + f"{json.dumps(key)}:\n" + BODY)
    result = cli("--config", "c.yaml", "--key", "ok")
    assert (result.rc, result.err) == (
        2,
        f"config error: c.yaml:{key!r}: a config key is letters, digits, '.', '_' and '-', starting with a "
        "letter or digit (keys are selected by glob and listed with commas)\n",
    )
