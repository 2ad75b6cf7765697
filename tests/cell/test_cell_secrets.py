"""Secrets are masked by value, not only by variable name: dry runs, logs, cell.json, status.txt."""

from __future__ import annotations

import dataclasses
import json

import pytest
from agentsweep.cell.engines import EngineLaunch
from agentsweep.cell.lifecycle import run_cell
from agentsweep.cell.placement import free_port
from agentsweep.cell.plan import CellOptions, plan_cell
from agentsweep.cell.port_allocation import FreePortAllocator
from agentsweep.cell.record import mask_env, mask_text
from agentsweep.cli import main
from agentsweep.contract.cell import CELL_ENV_VAR, Cell

HF = "hf_" + "Ab3" * 12
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"
GHP = "ghp_" + "x1Y2" * 9
PAT = "github_pat_" + "11AAAA_" * 5
SK = "sk-" + "proj-" + "q9" * 12
TOKENS = (HF, AWS, GHP, PAT, SK)
ENV_SECRET = "pa55-w0rd-from-env"

CELL = {
    "exp_name": "sec-tp1-ep1-u2-off",
    "engine": "sim",
    "model": "m",
    "tp": 1,
    "users": 2,
    "offload": "off",
    "duration": 10,
    "traces": "t",
    "speed": 50,
    "hardware": "h200",
    # Token-shaped values under names that say nothing, and the environment's secret in a URL.
    "engine_env": {"EXTRA_HEADER": f"Bearer {HF}", "AWS_ID": AWS, "MIRROR": f"https://u:{ENV_SECRET}@h/x"},
    # (A served name other than the model's is refused: the token rides as a second, extra name.)
    "engine_args": f"--served-model-name m {SK} --note {GHP}-{PAT}",
}


@pytest.fixture
def env(monkeypatch):
    for key in (CELL_ENV_VAR, "RESULT_DIR", "PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SERVICE_PASSWORD", ENV_SECRET)  # a secret-named variable of the environment
    return monkeypatch


def _leaks(text: str) -> list[str]:
    return [t for t in (*TOKENS, ENV_SECRET) if t in text]


@pytest.mark.parametrize("token", TOKENS)
def test_token_shaped_values_are_masked_anywhere(token):
    assert mask_text(f"x={token};") == "x=***;"


def test_ordinary_words_are_not_tokens():
    text = "sk-learn hf_transfer --kv-cache-dtype AKIA ghp_short github_pat_ sk-short"
    assert mask_text(text, set()) == text


def test_secret_values_are_masked_under_any_name(env):
    assert mask_env({"HF_TOKEN": "tok-123456", "OTHER": "a tok-123456 b", "X": ENV_SECRET, "P": "/bin"}) == {
        "HF_TOKEN": "***",
        "OTHER": "a *** b",
        "X": "***",
        "P": "/bin",
    }
    # The sweep's config key is a name, not a key: never hidden.
    env.setenv("CONFIG_KEY", "demo-mini")
    assert mask_text("results/demo-mini") == "results/demo-mini"


def test_cell_dry_run_and_mask_lines(env, capsys, tmp_path):
    env.setenv("RESULT_DIR", str(tmp_path / "r"))
    assert main(["cell", "--cell", json.dumps(CELL), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "EXTRA_HEADER='Bearer ***'" in out and "--served-model-name m '***'" in out
    assert _leaks(out) == []
    assert main(["cell", "--cell", json.dumps(CELL), "--add-mask"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(f"::add-mask::{t}" for t in TOKENS)


def test_sweep_dry_run_masks_the_cell(env, tmp_path, capsys):
    config = tmp_path / "sweep.yaml"
    config.write_text(
        "k:\n  runner: local\n  engine: sim\n  model: m\n  precision: fp8\n  duration: 5\n  traces: t\n"
        f"  engine_args: '--served-model-name m {SK}'\n"
        f"  engine_env: {{EXTRA_HEADER: 'Bearer {HF}', MIRROR: 'https://u:{ENV_SECRET}@h'}}\n"
        "  search_space:\n    tp1: {users: [1], offload: [off]}\n"
    )
    assert (
        main(["sweep", "--key", "k", "--config", str(config), "--results", str(tmp_path), "--dry-run"]) == 0
    )
    out = capsys.readouterr().out
    assert "AGENTSWEEP_CELL=" in out and "engine:" in out
    assert _leaks(out) == []


@pytest.mark.integration
def test_cell_json_status_and_log_never_hold_a_secret(env, standins, tmp_path):
    rd = tmp_path / "r"
    port = free_port()
    cell = Cell.parse(CELL, where="test")
    plan = plan_cell(cell, rd, ports=FreePortAllocator(cell_port=port))
    engine = dataclasses.replace(
        plan.instances[0],
        engine=EngineLaunch(
            argv=[*standins["engine"], "--port", str(port), "--mode", "crash-at-start", f"--x={HF}"],
            env=cell.engine_env,
        ),
        scraper_argv=[*standins["scraper"], str(rd)],
    )
    plan = dataclasses.replace(
        plan, instances=[engine], replay_argv=[*standins["replayer"], str(rd), "0.5", "0", GHP]
    )
    logged: list[str] = []
    status, reason = run_cell(
        plan,
        CellOptions(health_timeout_s=20, engine_stop_grace_s=2),
        log=logged.append,
    )
    assert status == "FAILED"
    record = (rd / "cell.json").read_text()
    assert _leaks(record) == [] and _leaks((rd / "status.txt").read_text()) == []
    assert _leaks("\n".join(logged)) == [], logged
    data = json.loads(record)
    assert f"--x={HF}" not in data["engine_command"] and "--x=***" in data["engine_command"]
    assert data["cell"]["engine_env"]["EXTRA_HEADER"] == "Bearer ***"
    assert data["engine_env"]["MIRROR"] == "https://u:***@h/x"
    assert "***" in data["cell"]["engine_args"] and reason
    assert data["replay_command"][-1] == "***"
