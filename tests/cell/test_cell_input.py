"""The cell as `agentsweep cell` reads it: one JSON value, typed once, every bad value one line (exit 2)."""

from __future__ import annotations

import json

import pytest
from agentsweep.cell.record import mask_argv, mask_cell, mask_env
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR, CELL_SCHEMA, FLAT_FIELDS, GROUPS, Cell, flat_fields
from agentsweep.contract.receipt import read_receipt, recipe_fingerprint, replayer_version, verify
from agentsweep.errors import InputError

GOOD = {
    "exp_name": "demo-tp1-ep1-u2-on",
    "engine": "sim",
    "model": "m",
    "tp": 1,
    "users": 2,
    "offload": "on",
    "cpu_dram_gb": 8,
    "duration": 10,
    "traces": "t",
    "ignore_eos": True,
    "speed": 50,
    "hardware": "h200",
}


@pytest.fixture
def clean_env(monkeypatch):
    for key in (CELL_ENV_VAR, "RESULT_DIR", "PORT"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_parse_types_and_defaults():
    cell = Cell.parse(json.dumps(GOOD))
    assert (cell.tp, cell.gpus, cell.users, cell.cpu_dram_gb, cell.replay.ignore_eos, cell.speed) == (
        1,
        1,
        2,
        8.0,
        True,
        50.0,
    )
    assert cell.replay.seed == 0 and cell.replay.api == "chat" and cell.runner == "local"
    assert Cell.parse(cell.to_json()) == cell


def test_a_cell_of_schema_1_reads_as_the_same_cell_and_flat_renders_it_back():
    """Earlier runs' cell.json held every field at the top and engine_env as JSON text (schema 1)."""
    cell = Cell.parse({**GOOD, "max_delay": 30, "max_failed_share": 0.05, "engine_env": {"A": 1}})
    assert (cell.replay.max_delay, cell.limits.max_failed_share, cell.node.hardware) == (30.0, 0.05, "h200")
    assert cell.engine_env == {"A": "1"} and cell.schema_version == CELL_SCHEMA
    nested = json.loads(cell.to_json())
    assert set(GROUPS) <= set(nested) and "max_delay" not in nested and nested["replay"]["max_delay"] == 30.0
    flat = cell.flat()
    assert tuple(flat) == FLAT_FIELDS and not set(GROUPS) & set(flat) and "schema_version" not in flat
    assert (flat["max_delay"], flat["hardware"], flat["engine_env"]) == (30.0, "h200", '{"A":"1"}')
    assert Cell.parse(json.dumps(flat)) == cell == Cell.parse(nested)
    assert flat_fields(nested) == flat
    # The recipe fingerprint is taken over the flat form: a schema-1 cell.json that did not parse
    # keeps the fingerprint its typed cell has.
    versions = {"engine_version": "1", "client_version": "2"}
    assert recipe_fingerprint(cell, **versions) == recipe_fingerprint(flat, **versions)
    assert recipe_fingerprint(nested, **versions) == recipe_fingerprint(cell, **versions)
    # A field named at the top wins over its group's (how Cell.replace changes one).
    assert Cell.parse({**nested, "max_delay": 5}).replay.max_delay == 5.0
    assert cell.replace(seed=7).replay.seed == 7 and cell.replace(seed=7).replay.max_delay == 30.0
    with pytest.raises(InputError, match=r"^cell\.schema_version: 3 is not one of 2$"):
        Cell.parse({**nested, "schema_version": 3})
    with pytest.raises(InputError, match=r"^cell\.replay\.bogus: unknown field$"):
        Cell.parse({**nested, "replay": {"bogus": 1}})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tp": "two"}, "$AGENTSWEEP_CELL.tp: expected an integer, got 'two'"),
        ({"tp": 0}, "$AGENTSWEEP_CELL.tp: must be > 0, got 0"),
        ({"users": 1.5}, "$AGENTSWEEP_CELL.users: expected an integer, got 1.5"),
        ({"offload": "maybe"}, "$AGENTSWEEP_CELL.offload: 'maybe' is not one of on, off, noprefix"),
        ({"engine": "trt"}, "$AGENTSWEEP_CELL.engine: 'trt' is not one of vllm, sglang, sim"),
        (
            {"ignore_eos": "perhaps"},
            "$AGENTSWEEP_CELL.replay.ignore_eos: expected true or false, got 'perhaps'",
        ),
        ({"cpu_dram_gb": "nan"}, "$AGENTSWEEP_CELL.cpu_dram_gb: expected a number, got 'nan'"),
        ({"engine_env": "[1]"}, "$AGENTSWEEP_CELL.engine_env: expected a mapping of NAME: value, got [1]"),
        ({"engine_env": "{"}, "$AGENTSWEEP_CELL.engine_env: not valid JSON"),
        ({"exp_name": "a/b"}, "$AGENTSWEEP_CELL.exp_name: 'a/b': use only [A-Za-z0-9._-]"),
        ({"exp_name": "../x"}, "$AGENTSWEEP_CELL.exp_name: '../x': use only [A-Za-z0-9._-]"),
        ({"client": "locust"}, "$AGENTSWEEP_CELL.client: 'locust' is not one of replay, aiperf"),
        (
            {"engine": "vllm"},
            "$AGENTSWEEP_CELL.speed: only the simulated engine (engine: sim) can run faster",
        ),
        ({"model": None}, "$AGENTSWEEP_CELL.model: required field is missing"),
        ({"colour": "red"}, "$AGENTSWEEP_CELL.colour: unknown field"),
    ],
)
def test_bad_cell_is_one_line_exit_2(tmp_path, clean_env, capsys, change, message):
    cell = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    clean_env.setenv(CELL_ENV_VAR, json.dumps(cell))
    clean_env.setenv("RESULT_DIR", str(tmp_path / "r"))
    assert main(["cell"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("input error: ")
    assert message in err
    # The refusal still leaves a verdict for the artifact, with the cell as it was given.
    assert (tmp_path / "r" / "status.txt").read_text().splitlines()[0] == "FAILED"
    assert json.loads((tmp_path / "r" / "cell.json").read_text())["cell"] == cell
    # ... and its receipt, last, whose recipe covers the cell as given.
    receipt = read_receipt(tmp_path / "r")
    assert sorted(receipt.files) == ["cell.json", "status.txt"] and verify(tmp_path / "r") == []
    assert receipt.recipe_fingerprint == recipe_fingerprint(cell, engine_version=None, client_version=None)


def test_cell_flag_takes_json_or_a_file(tmp_path, clean_env, capsys):
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(GOOD))
    for arg in (json.dumps(GOOD), f"@{path}"):
        assert main(["cell", "--cell", arg, "--check"]) == 0
        assert capsys.readouterr().out == "demo-tp1-ep1-u2-on\n"
    assert main(["cell", "--cell", "{not json", "--check"]) == 2
    assert capsys.readouterr().err.startswith("input error: --cell: not a JSON object")
    assert main(["cell", "--cell", f"@{tmp_path / 'missing.json'}", "--check"]) == 2
    assert capsys.readouterr().err == f"input error: --cell @{tmp_path / 'missing.json'}: file not found\n"
    assert main(["cell", "--check"]) == 2
    assert f"set ${CELL_ENV_VAR}" in capsys.readouterr().err


def test_result_dir_and_port_checked(tmp_path, clean_env, capsys):
    assert main(["cell"]) == 2
    assert "RESULT_DIR is required" in capsys.readouterr().err
    clean_env.setenv(CELL_ENV_VAR, json.dumps(GOOD))
    clean_env.setenv("RESULT_DIR", str(tmp_path))
    clean_env.setenv("PORT", "99999")
    assert main(["cell"]) == 2
    assert "PORT='99999': expected a TCP port number" in capsys.readouterr().err
    assert (tmp_path / "status.txt").read_text().startswith("FAILED\ninput error: environment variable PORT=")
    # A valid cell refused for its port: its receipt's recipe is the typed cell's.
    typed = Cell.parse(GOOD)
    assert read_receipt(tmp_path).recipe_fingerprint == recipe_fingerprint(
        mask_cell(typed.model_dump(mode="json")), engine_version=None, client_version=replayer_version()
    )
    done = tmp_path / "done"
    done.mkdir()
    (done / "status.txt").write_text("SUCCESS\n")
    clean_env.setenv("RESULT_DIR", str(done))
    assert main(["cell"]) == 2
    assert "already holds a cell result (status.txt)" in capsys.readouterr().err
    assert (done / "status.txt").read_text() == "SUCCESS\n"  # never overwritten


def test_dry_run_prints_the_resolved_commands(clean_env, capsys, tmp_path):
    clean_env.setenv("RESULT_DIR", str(tmp_path / "r"))
    assert main(["cell", "--cell", json.dumps(GOOD), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "engine-sim m --host 127.0.0.1 --port '$PORT' --tensor-parallel-size 1 --hardware h200 --speed 50"
        in out
    )
    assert "--kv-offloading-size 8" in out and "--time-scale 0.02" in out
    assert not (tmp_path / "r").exists()


def test_secrets_are_masked():
    assert mask_env({"HF_TOKEN": "x", "MY_API_KEY": "y", "db_password": "z", "PATH": "/bin"}) == {
        "HF_TOKEN": "***",
        "MY_API_KEY": "***",
        "db_password": "***",
        "PATH": "/bin",
    }
    assert mask_argv(
        ["serve", "--enable-prompt-tokens-details", "--api-key", "s3", "--hf-token=abc", "--port", "1"]
    ) == [
        "serve",
        "--enable-prompt-tokens-details",
        "--api-key",
        "***",
        "--hf-token=***",
        "--port",
        "1",
    ]
    masked = mask_cell({"engine_env": json.dumps({"HF_TOKEN": "t", "A": "1"}), "engine_args": "--api-key k"})
    assert json.loads(masked["engine_env"]) == {"A": "1", "HF_TOKEN": "***"}
    assert masked["engine_args"] == "--api-key '***'"


def test_a_hand_made_cell_gets_its_runner_facts_by_default():
    bare = {k: v for k, v in GOOD.items() if k != "hardware"}
    local = Cell.parse(bare)
    assert (local.node.hardware, local.node.gres_type, local.node.gpus_per_node) == ("", "", 1)
    assert (local.node.intra_node_gbs, local.node.inter_node_gbs, local.kv_transfer_gbs) == (
        450.0,
        50.0,
        None,
    )
    named = Cell.parse({**bare, "runner": "mi355x", "tp": 4})
    assert (named.node.hardware, named.node.gres_type, named.node.gpus_per_node) == ("mi355x", "mi355x", 4)
    # Every GPU the simulated engine has a profile of is a runner name that stands for it.
    assert Cell.parse({**bare, "runner": "gb300"}).hardware_label == "simulated GB300"
    # What the matrix resolved is kept as given, even where the runner's name says otherwise.
    site = Cell.parse({**GOOD, "runner": "h200", "hardware": "", "gres_type": "gpu_a", "gpus_per_node": 4})
    assert (site.node.hardware, site.node.gres_type, site.node.gpus_per_node) == ("", "gpu_a", 4)
    assert Cell.parse(site.to_json()) == site


@pytest.mark.parametrize(
    ("shape", "nodes", "gpus_per_node"),
    [
        ({"tp": 1, "replicas": 2}, 1, 2),
        ({"tp": 1, "replicas": 2}, 2, 1),
        ({"tp": 2, "replicas": 3}, 2, 4),
        ({"tp": 2, "prefill": {"replicas": 1, "tp": 1}, "decode": {"replicas": 1, "tp": 2}}, 2, 2),
    ],
)
def test_a_hand_made_cell_spanning_nodes_packs_onto_the_fewest_gpus_per_node(shape, nodes, gpus_per_node):
    cell = Cell.parse(
        {**GOOD, "offload": "off", "cpu_dram_gb": 0, "router": "random", **shape, "nodes": nodes}
    )
    assert cell.node.gpus_per_node == gpus_per_node


def test_the_kv_transfer_bandwidth_is_the_link_the_cell_spans():
    pd = {"tp": 1, "prefill": {"tp": 1}, "decode": {"tp": 1}, "router": "random"}
    cell = Cell.parse({**GOOD, **pd, "intra_node_gbs": 321, "inter_node_gbs": 12.5})
    assert cell.kv_transfer_gbs == 321.0
    assert cell.replace(nodes=2).kv_transfer_gbs == 12.5


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"hardware": "a100"},
            "$AGENTSWEEP_CELL.node.hardware: 'a100' is not one of h200, b200, b300, gb200, gb300, mi325x, mi355x",
        ),
        # A simulated cell says which GPU it simulates; it is not run as some default one.
        (
            {"hardware": ""},
            "cell demo-tp1-ep1-u2-on: hardware: a simulated cell names the GPU it simulates (h200, b200, "
            "b300, gb200, gb300, mi325x, mi355x), and runner 'local' states none",
        ),
        ({"gres_type": "gpu h200"}, "$AGENTSWEEP_CELL.node.gres_type: String should match pattern"),
        ({"gpus_per_node": -1}, "$AGENTSWEEP_CELL.node.gpus_per_node: must be >= 0, got -1"),
        ({"intra_node_gbs": 0}, "$AGENTSWEEP_CELL.node.intra_node_gbs: must be > 0.0, got 0"),
    ],
)
def test_bad_runner_facts_are_one_line(clean_env, capsys, tmp_path, change, message):
    clean_env.setenv(CELL_ENV_VAR, json.dumps({**GOOD, **change}))
    clean_env.setenv("RESULT_DIR", str(tmp_path))
    assert main(["cell", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_cell_needs_no_runners_file(clean_env, capsys, tmp_path):
    """Everything the cell needs of its runner is in it: no runners.yaml is read at cell time."""
    clean_env.setenv("AGENTSWEEP_RUNNERS", str(tmp_path / "absent.yaml"))
    clean_env.setenv("RESULT_DIR", str(tmp_path / "r"))
    cell = {**{k: v for k, v in GOOD.items() if k != "hardware"}, "runner": "b200"}
    assert main(["cell", "--cell", json.dumps(cell), "--dry-run"]) == 0
    assert "--hardware b200" in capsys.readouterr().out
