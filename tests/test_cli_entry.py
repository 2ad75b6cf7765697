"""The two console scripts dispatch and report unknown commands with exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from agentsweep.cli import main as agentsweep_main
from kv_cache_tester.cli import main as kvt_main


def test_agentsweep_unknown_command(capsys):
    assert agentsweep_main(["matrx"]) == 2
    assert "did you mean 'matrix'" in capsys.readouterr().err


def test_agentsweep_help_lists_commands(capsys):
    assert agentsweep_main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("matrix", "engine-sim", "collect", "sweep"):
        assert name in out


def test_kv_cache_tester_unknown_command(capsys):
    assert kvt_main(["nope"]) == 2
    assert "unknown command" in capsys.readouterr().err


@pytest.mark.integration
def test_console_scripts_installed():
    out = subprocess.run(
        [sys.executable, "-m", "kv_cache_tester.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("kv-cache-tester ")


@pytest.mark.integration
def test_bad_flags_are_one_line_exit_2():
    for argv in (["agentsweep", "matrix", "--bogus"], ["kv-cache-tester", "replay", "--max-users", "x"]):
        module = "agentsweep.cli" if argv[0] == "agentsweep" else "kv_cache_tester.cli"
        proc = subprocess.run([sys.executable, "-m", module, *argv[1:]], capture_output=True, text=True)
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("usage error: "), proc.stderr


@pytest.mark.integration
def test_a_reader_that_stops_reading_is_no_traceback(repo_root):
    """`agentsweep matrix ... --json | head`: the writer ends quietly, as one killed by SIGPIPE reads."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentsweep.cli", "matrix", "--config", str(repo_root / "configs" / "agentic.yaml"),
         "--key", "*", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10) == b'{"include"'
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


def test_one_error_family_from_the_replayer_up(monkeypatch, capsys):
    """agentsweep's errors derive from the replayer's, so a replayer error raised inside an agentsweep
    command (a trace loaded in-process, say) is one line and its exit status, never a traceback."""
    import agentsweep.config.cli as matrix_cli
    from agentsweep.errors import AgentsweepError, InputError, WriteError
    from kv_cache_tester.errors import KVTesterError, TraceError, WriteFailed

    assert issubclass(AgentsweepError, KVTesterError) and issubclass(WriteError, WriteFailed)
    full = WriteError("out/x.csv", OSError(28, "No space left on device"))
    assert str(full) == "out/x.csv: cannot write: no space left on device" and full.exit_code == 2
    assert InputError("x").render() == "input error: x"

    def broken(args):
        raise TraceError("traces/a.json: request 3: input_length: not a number")

    monkeypatch.setattr(matrix_cli, "run", broken)
    assert agentsweep_main(["matrix", "--key", "demo"]) == 2
    assert capsys.readouterr().err == "trace error: traces/a.json: request 3: input_length: not a number\n"
