"""The cell from the environment: typed once, every bad value one line naming the variable (exit 2)."""

from __future__ import annotations

import json

import pytest
from agentsweep.cell.record import mask_argv, mask_cell, mask_env
from agentsweep.cell.spec import CellSpec, cell_dict_to_env
from agentsweep.cli import main
from agentsweep.config import CELL_FIELDS

GOOD = {
    "EXP_NAME": "demo-tp1-ep1-u2-on",
    "ENGINE": "sim",
    "MODEL": "m",
    "TP": "1",
    "USERS": "2",
    "OFFLOAD": "on",
    "CPU_DRAM_GB": "8",
    "DURATION": "10",
    "TRACES": "t",
    "IGNORE_EOS": "true",
    "SPEED": "50",
}


def test_fields_match_the_matrix_contract():
    assert set(CellSpec.__dataclass_fields__) == set(CELL_FIELDS)


def test_parse_types_and_defaults():
    spec = CellSpec.from_env(GOOD)
    assert (spec.tp, spec.gpus, spec.users, spec.cpu_dram_gb, spec.ignore_eos, spec.speed) == (
        1,
        1,
        2,
        8.0,
        True,
        50.0,
    )
    assert spec.seed is None and spec.api == "chat"
    assert CellSpec.from_env(cell_dict_to_env(spec.to_dict())) == spec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"TP": "two"}, "environment variable TP='two': expected an integer"),
        ({"TP": "0"}, "environment variable TP=0: must be >= 1"),
        ({"USERS": "1.5"}, "environment variable USERS='1.5': expected an integer"),
        ({"OFFLOAD": "maybe"}, "environment variable OFFLOAD='maybe': expected one of on, off, noprefix"),
        ({"ENGINE": "trt"}, "environment variable ENGINE='trt': expected one of vllm, sglang, sim"),
        ({"IGNORE_EOS": "perhaps"}, "environment variable IGNORE_EOS='perhaps': expected true or false"),
        ({"CPU_DRAM_GB": "nan"}, "environment variable CPU_DRAM_GB='nan': expected a finite number"),
        ({"ENGINE_ENV": "[1]"}, "environment variable ENGINE_ENV: must be a JSON object of NAME: value"),
        ({"ENGINE_ENV": "{"}, "environment variable ENGINE_ENV: not valid JSON"),
        ({"EXP_NAME": "a/b"}, "environment variable EXP_NAME='a/b': use only [A-Za-z0-9._-]"),
        ({"CLIENT": "locust"}, "environment variable CLIENT='locust': expected one of replay, aiperf"),
        (
            {"ENGINE": "vllm"},
            "environment variable SPEED=50.0: only the sim engine runs faster than real time",
        ),
        ({"MODEL": None}, "environment variable MODEL is required"),
    ],
)
def test_bad_cell_env_is_one_line_exit_2(tmp_path, monkeypatch, capsys, change, message):
    env = {**GOOD, **change, "RESULT_DIR": str(tmp_path / "r")}
    for key in [*CELL_FIELDS_UPPER, "RESULT_DIR", "PORT"]:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        if value is not None:
            monkeypatch.setenv(key, value)
    assert main(["cell"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("input error: ")
    assert message in err
    # The refusal still leaves a verdict for the artifact.
    assert (tmp_path / "r" / "status.txt").read_text().splitlines()[0] == "FAILED"


CELL_FIELDS_UPPER = [f.upper() for f in CELL_FIELDS]


def test_result_dir_and_port_checked(tmp_path, monkeypatch, capsys):
    for key in [*CELL_FIELDS_UPPER, "RESULT_DIR", "PORT"]:
        monkeypatch.delenv(key, raising=False)
    assert main(["cell"]) == 2
    assert "RESULT_DIR is required" in capsys.readouterr().err
    for key, value in GOOD.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RESULT_DIR", str(tmp_path))
    monkeypatch.setenv("PORT", "99999")
    assert main(["cell"]) == 2
    assert "PORT='99999': expected a TCP port number" in capsys.readouterr().err
    assert (tmp_path / "status.txt").read_text().startswith("FAILED\ninput error: environment variable PORT=")
    done = tmp_path / "done"
    done.mkdir()
    (done / "status.txt").write_text("SUCCESS\n")
    monkeypatch.setenv("RESULT_DIR", str(done))
    assert main(["cell"]) == 2
    assert "already holds a cell result (status.txt)" in capsys.readouterr().err
    assert (done / "status.txt").read_text() == "SUCCESS\n"  # never overwritten


def test_dry_run_prints_the_resolved_commands(monkeypatch, capsys, tmp_path):
    for key, value in GOOD.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RESULT_DIR", str(tmp_path / "r"))
    monkeypatch.delenv("PORT", raising=False)
    assert main(["cell", "--dry-run"]) == 0
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
