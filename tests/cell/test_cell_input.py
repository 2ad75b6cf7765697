"""The cell as `agentsweep cell` reads it: one JSON value, typed once, every bad value one line (exit 2)."""

from __future__ import annotations

import json

import pytest
from agentsweep.cell.record import mask_argv, mask_cell, mask_env
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR, Cell

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
}


@pytest.fixture
def clean_env(monkeypatch):
    for key in (CELL_ENV_VAR, "RESULT_DIR", "PORT"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_parse_types_and_defaults():
    cell = Cell.parse(json.dumps(GOOD))
    assert (cell.tp, cell.gpus, cell.users, cell.cpu_dram_gb, cell.ignore_eos, cell.speed) == (
        1,
        1,
        2,
        8.0,
        True,
        50.0,
    )
    assert cell.seed == 0 and cell.api == "chat" and cell.runner == "local"
    assert Cell.parse(cell.to_json()) == cell


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tp": "two"}, "$AGENTSWEEP_CELL.tp: expected an integer, got 'two'"),
        ({"tp": 0}, "$AGENTSWEEP_CELL.tp: must be > 0, got 0"),
        ({"users": 1.5}, "$AGENTSWEEP_CELL.users: expected an integer, got 1.5"),
        ({"offload": "maybe"}, "$AGENTSWEEP_CELL.offload: 'maybe' is not one of on, off, noprefix"),
        ({"engine": "trt"}, "$AGENTSWEEP_CELL.engine: 'trt' is not one of vllm, sglang, sim"),
        ({"ignore_eos": "perhaps"}, "$AGENTSWEEP_CELL.ignore_eos: expected true or false, got 'perhaps'"),
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


def test_cell_flag_takes_json_or_a_file(tmp_path, clean_env, capsys):
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(GOOD))
    for arg in (json.dumps(GOOD), f"@{path}"):
        assert main(["cell", "--cell", arg, "--check"]) == 0
        assert capsys.readouterr().out == "demo-tp1-ep1-u2-on\n"
    assert main(["cell", "--cell", "{not json", "--check"]) == 2
    assert capsys.readouterr().err.startswith("input error: --cell: not a JSON object")
    assert main(["cell", "--cell", f"@{tmp_path / 'missing.json'}", "--check"]) == 2
    assert "cannot read" in capsys.readouterr().err
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
