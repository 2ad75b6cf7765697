"""--preset agentx: fills the options left unset with InferenceX's replay settings, refuses
contradicting ones, needs 900 s, and a run that departs from it says so by name."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from agentsweep.cell.clients.replay import replay_command
from agentsweep.config import load_sweep
from agentsweep.contract.cell import Cell
from agentsweep.errors import ConfigError, InputError
from kv_cache_tester.errors import UsageError
from kv_cache_tester.replay.cli import add_arguments
from kv_cache_tester.replay.config import from_args, options_dict
from kv_cache_tester.replay.presets import deviations

BASE = ["--api-endpoint", "http://127.0.0.1:9", "--trace-directory", "t", "--output-dir", "o"]


def _parse(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([*BASE, *extra])


def test_the_preset_sets_what_is_left_unset():
    cfg = from_args(_parse("--preset", "agentx", "--test-duration", "900"))
    assert (cfg.advance_min, cfg.advance_max, cfg.max_delay, cfg.ignore_eos) == (0.25, 0.75, 300.0, True)
    assert (cfg.warmup_requests_per_user, cfg.warmup_one_token, cfg.system_idle_cap) == (10, True, 10.0)
    assert (cfg.failed_request_threshold, cfg.seed) == (0.10, 42)
    plain = from_args(_parse("--test-duration", "900"))
    assert (plain.advance_min, plain.max_delay, plain.ignore_eos) == (0.0, 60.0, False)
    assert (plain.warmup_one_token, plain.system_idle_cap, plain.failed_request_threshold) == (
        False,
        0.0,
        0.0,
    )
    ns = _parse("--preset", "agentx", "--test-duration", "900")
    from_args(ns)
    assert options_dict(ns)["preset"] == "agentx" and "preset_defaults" not in options_dict(ns)


def test_more_warmup_requests_still_fit_the_preset():
    cfg = from_args(
        _parse("--preset", "agentx", "--test-duration", "1200", "--warmup-requests-per-user", "12")
    )
    assert cfg.warmup_requests_per_user == 12
    with pytest.raises(UsageError, match="sets --warmup-requests-per-user 10"):
        from_args(_parse("--preset", "agentx", "--test-duration", "1200", "--warmup-requests-per-user", "3"))


def test_a_run_that_departs_from_the_preset_names_each_setting():
    ns = _parse("--preset", "agentx", "--test-duration", "1200", "--warmup-requests-per-user", "12")
    from_args(ns)
    assert deviations("agentx", options_dict(ns)) == [
        "warmup_requests_per_user 12 (preset 10)",
        "test_duration 1200 (InferenceX 3600)",
    ]
    ns = _parse("--preset", "agentx", "--test-duration", "3600", "--workers", "2")
    from_args(ns)
    assert deviations("agentx", options_dict(ns)) == ["workers 2 (InferenceX 1)"]
    ns = _parse("--preset", "agentx", "--test-duration", "3600")
    from_args(ns)
    assert deviations("agentx", options_dict(ns)) == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--test-duration", "600"], "--preset agentx needs --test-duration of at least 900 s"),
        ([], "--preset agentx needs --test-duration of at least 900 s"),
        (["--test-duration", "900", "--max-delay", "30"], "--preset agentx sets --max-delay 300.0; drop"),
        (["--test-duration", "900", "--seed", "7"], "--preset agentx sets --seed 42; drop"),
        (["--test-duration", "900", "--system-idle-cap", "5"], "sets --system-idle-cap 10.0"),
        (["--test-duration", "900", "--advance-max", "0.5"], r"sets --advance-max 0\.75"),
    ],
)
def test_what_contradicts_the_preset_is_refused(extra, message):
    with pytest.raises(UsageError, match=message):
        from_args(_parse("--preset", "agentx", *extra))


CELL = {"exp_name": "x", "engine": "vllm", "model": "m", "tp": 1, "users": 4, "offload": "off", "traces": "t"}


def test_a_cell_with_the_preset_carries_its_values():
    cell = Cell.parse({**CELL, "duration": 900, "preset": "agentx"})
    assert (
        cell.replay.advance_min,
        cell.replay.advance_max,
        cell.replay.max_delay,
        cell.replay.ignore_eos,
    ) == (0.25, 0.75, 300.0, True)
    assert (
        cell.replay.warmup_requests,
        cell.replay.warmup_one_token,
        cell.replay.system_idle_cap,
        cell.replay.seed,
    ) == (
        10,
        True,
        10.0,
        42,
    )
    assert cell.replay.failed_request_threshold == 0.10
    argv = replay_command(cell, endpoint="http://127.0.0.1:9", output_dir=Path("o"), python="python")
    for flag, value in (("--system-idle-cap", "10"), ("--failed-request-threshold", "0.1"), ("--seed", "42")):
        assert argv[argv.index(flag) + 1] == value
    assert "--warmup-one-token" in argv and argv[argv.index("--preset") + 1] == "agentx"
    with pytest.raises(InputError, match="cell: preset agentx needs a duration of at least 900 s, got 600"):
        Cell.parse({**CELL, "duration": 600, "preset": "agentx"})
    with pytest.raises(InputError, match=r"preset agentx sets max_delay 300\.0; drop max_delay 30"):
        Cell.parse({**CELL, "duration": 900, "preset": "agentx", "max_delay": 30})


def test_a_config_entry_names_the_preset(tmp_path):
    text = (
        "k:\n  runner: local\n  engine: sim\n  model: m\n  precision: fp8\n  duration: {d}\n  traces: t\n"
        "  replay: {{preset: agentx}}\n  search_space: {{tp1: {{users: 2}}}}\n"
    )
    (tmp_path / "ok.yaml").write_text(text.format(d=900))
    spec = load_sweep(tmp_path / "ok.yaml", "k")
    assert spec.replay.preset == "agentx" and spec.replay.max_delay == 300.0
    (tmp_path / "short.yaml").write_text(text.format(d=60))
    with pytest.raises(ConfigError, match="preset agentx needs a duration of at least 900 s"):
        load_sweep(tmp_path / "short.yaml", "k")
