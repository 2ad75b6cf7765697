"""Hostile configs: every one ends with exit status 2 and one short line, fast, through the real CLI.

Before the limits an alias bomb printed a 322 MB line (or ran out of memory), deep nesting raised
RecursionError, a FIFO given as --config blocked forever, and absurd numbers, control characters and
names differing only in case were accepted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from agentsweep.config import loader

ENTRY = (
    "{key}:\n  runner: local\n  engine: sim\n  model: {model}\n  precision: fp8\n  duration: {duration}\n"
    "  traces: t\n  engine_args: {args}\n  search_space:\n    tp{tp}: {{users: [{users}]}}\n"
)


def entry(key: str = "k", model: str = "m", duration: str = "10", args: str = "''", tp: int = 1, users="1"):
    return ENTRY.format(key=key, model=model, duration=duration, args=args, tp=tp, users=users)


def run_matrix(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The real `agentsweep matrix` in a child process: a hang is a failure, not a stuck test run.

    The timeout guards against a hang, it is no speed target: the largest file the size limit admits
    takes about 5 s of pure-Python YAML parsing on an idle core, several times that on a busy one."""
    proc = subprocess.run(
        [sys.executable, "-m", "agentsweep.cli", "matrix", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in {**os.environ, **(env or {})}.items() if k != "GITHUB_ACTIONS"},
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


def one_line(err: str) -> str:
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err[:2000]
    assert len(err) - 1 <= 300, err[:2000]
    return err[:-1]


def alias_bomb() -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n" + entry(model="*a8")


def alias_chain(n: int) -> str:
    lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, n)]
    return "\n".join(lines) + "\n" + entry(model=f"*a{n - 1}")


HOSTILE: dict[str, tuple[str | bytes, str]] = {
    "alias bomb": (alias_bomb(), "c.yaml:6: expands to more than 100,000 values (aliases counted"),
    "deep flow nesting": (
        "k: " + "[" * 5000 + "]" * 5000 + "\n",
        "c.yaml:1: invalid YAML: nested more than 32",
    ),
    "deep block nesting": (
        "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "x: 1\n",
        "c.yaml:32: invalid YAML: nested more than 32 levels deep",
    ),
    "deep alias chain": (alias_chain(5000), "nested more than 32 levels deep (aliases followed)"),
    "recursive alias": ("k: &a [*a]\n", "c.yaml:1: an alias refers to a node that contains it"),
    "over 128 KiB": ("#" + "x" * (128 << 10) + "\n" + entry(), "c.yaml: 128.1 KiB is over the 128 KiB limit"),
    "the most scalars 128 KiB can hold": (
        "k: [" + ",".join(["1"] * ((128 << 10) // 2 - 10)) + "]\n",
        "c.yaml:k: expected a mapping of fields, got [1, 1, 1,",
    ),
    "users repeated by an alias": (
        ".u: &u ["
        + ",".join(map(str, range(1, 4001)))
        + "]\n"
        + entry().replace("users: [1]", "users: *u, offload: [on, off, noprefix]"),
        "c.yaml:k: search_space: 12000 cells (tp x users x offload) is over the 10000 limit for one key",
    ),
    "many keys sharing an alias": (
        ".u: &u ["
        + ",".join(map(str, range(1, 3001)))
        + "]\n"
        + "".join(entry(key=f"k{i}").replace("users: [1]", "users: *u") for i in range(40)),
        "expands to more than 100,000 values",
    ),
    "users 10**11": (entry(users="100000000000"), "c.yaml:k.search_space.tp1.users[0]: must be <= 100000"),
    "duration 10**26": (entry(duration="1" + "0" * 26), "c.yaml:k.duration: must be <= 604800, got 1000"),
    "tp 4096": (entry(tp=4096), "c.yaml:k.search_space.tp4096.tp: must be <= 1024, got 4096"),
    "NUL in engine args": (entry(args='"--x\\0y"'), "c.yaml:k.engine_args: control character '\\x00'"),
    "NUL in an engine arg list": (
        entry(args='["--a", "b\\0"]'),
        "c.yaml:k.engine_args[1]: control character '\\x00' in 'b\\x00'",
    ),
    "newline inside one engine arg": (
        entry(args="\"'--a\\nb'\""),
        "c.yaml:k.engine_args: control character '\\n' in '--a\\nb'",
    ),
    "newline in model": (
        entry(model='"org/m\\nx"'),
        "c.yaml:k.model: control character '\\n' in 'org/m\\nx'",
    ),
    "escape in model": (entry(model='"m\\e[2J"'), "c.yaml:k.model: control character '\\x1b' in 'm\\x1b[2J'"),
    "bidi override in model": (entry(model='"m\\u202ex"'), "c.yaml:k.model: control character '\\u202e'"),
    "control character in a key": (entry(key='"k\\e[31m"'), "control character '\\x1b' in a key (line 1)"),
    "newline in a config key": (entry(key='"a\\nb"'), "c.yaml:'a\\nb': control character '\\n' in a key"),
    "UTF-16 with BOM": (entry().encode("utf-16"), "c.yaml: the file is UTF-16-LE (with a byte order mark)"),
    "UTF-16-BE without BOM": (entry().encode("utf-16-be"), "c.yaml: the file is UTF-16-BE text; save it"),
    "UTF-32": (entry().encode("utf-32"), "c.yaml: the file is UTF-32-LE (with a byte order mark) text"),
    "Latin-1": (entry(model="caf\xe9").encode("latin-1"), "c.yaml: not UTF-8 text (byte 0xe9 at offset"),
    "a 10,000-character field": (
        entry() + "  ? " + "f" * 10_000 + "\n  : 1\n",
        "c.yaml:k.'" + "f" * 56 + "...: unknown field",
    ),
    "a huge wrong-typed value": (
        entry(model="[" + ", ".join(["x" * 50] * 2_000) + "]"),
        "c.yaml:k.model: expected a string, got ['xxxxxxxxxx",
    ),
    "case-only different keys": (
        entry(key="Demo") + entry(key="demo"),
        "c.yaml:demo: exp_name demo-tp1-ep1-u1-on collides with Demo-tp1-ep1-u1-on of key 'Demo'",
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_config_is_one_short_line(tmp_path: Path, case: str) -> None:
    content, expected = HOSTILE[case]
    path = tmp_path / "c.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    key = "*" if case == "case-only different keys" else "k"
    rc, out, err = run_matrix(tmp_path, "--config", "c.yaml", "--key", key, "--json")
    line = one_line(err)
    assert (rc, out) == (2, "")
    assert line.startswith("config error: ")
    assert expected in line


@pytest.mark.integration
def test_non_regular_config_files_are_refused_unopened(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    (tmp_path / "dir.yaml").mkdir()
    (tmp_path / "dangling.yaml").symlink_to(tmp_path / "gone.yaml")
    cases = {
        "fifo.yaml": "config error: fifo.yaml: not a regular file (a FIFO)",
        "/dev/zero": "config error: /dev/zero: not a regular file (a character device)",
        "dir.yaml": "config error: dir.yaml: not a regular file (a directory)",
        "dangling.yaml": f"config error: dangling.yaml: broken symbolic link (to '{tmp_path / 'gone.yaml'}')",
    }
    for name, expected in cases.items():
        rc, _, err = run_matrix(tmp_path, "--config", name, "--key", "k")
        assert (rc, one_line(err)) == (2, expected)


@pytest.mark.integration
def test_fifo_as_runners_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "runners.yaml")
    (tmp_path / "c.yaml").write_text(entry())
    rc, _, err = run_matrix(
        tmp_path, "--config", "c.yaml", "--key", "k", env={"AGENTSWEEP_RUNNERS": "runners.yaml"}
    )
    assert (rc, one_line(err)) == (2, "config error: runners.yaml: not a regular file (a FIFO)")


@pytest.mark.integration
def test_control_character_in_a_runner_field(tmp_path: Path) -> None:
    (tmp_path / "runners.yaml").write_text(
        "local:\n  runs_on: [x]\n  launcher: runners/launch_local.sh\n  gpus_per_node: 8\n"
        '  cpu_dram_gb: 8\n  container_runtime: none\n  partition: "gpu\\x9b1m"\n'
    )
    (tmp_path / "c.yaml").write_text(entry())
    rc, _, err = run_matrix(
        tmp_path, "--config", "c.yaml", "--key", "k", env={"AGENTSWEEP_RUNNERS": "runners.yaml"}
    )
    assert (rc, one_line(err)) == (
        2,
        "config error: runners.yaml:local.partition: control character '\\x9b' in 'gpu\\x9b1m' (line 7); "
        "remove it",
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("speed", "20000", "k.speed: must be <= 10000.0, got 20000"),
        ("max_parallel", "1000", "k.max_parallel: must be <= 256, got 1000"),
        ("replay", "{seed: 4294967296}", "k.replay.seed: must be <= 4294967295, got 4294967296"),
        ("replay", "{max_delay: 100000}", "k.replay.max_delay: must be <= 86400.0, got 100000"),
        ("replay", "{warmup_requests: 1000000}", "k.replay.warmup_requests: must be <= 100000, got 1000000"),
        # The replayer's longest prompt: a larger cap passed the matrix and was refused in the cell.
        (
            "replay",
            "{max_context: 4194305}",
            "k.replay.max_context: must be <= 4194304, got 4194305",
        ),
        ("engine_env", '{A: "x\\ty"}', "k.engine_env: A: control character '\\t' in 'x\\ty'"),
        ("image", '"img\\u2028x"', "k.image: control character '\\u2028' in 'img\\u2028x' (line"),
    ],
)
def test_numeric_ranges_and_names(cli, in_tmp: Path, field: str, value: str, message: str) -> None:
    (in_tmp / "c.yaml").write_text(entry() + f"  {field}: {value}\n")
    result = cli("--config", "c.yaml", "--key", "k", "--json")
    assert result.rc == 2
    assert result.err.startswith(f"config error: c.yaml:{message}")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gpus_per_node", "2048", "local.gpus_per_node: must be <= 1024, got 2048"),
        ("time_limit_min", "100000", "local.time_limit_min: must be <= 43200, got 100000"),
        ("cpu_dram_gb", "10000000.0", "local.cpu_dram_gb: must be <= 1048576.0, got 10000000.0"),
    ],
)
def test_runner_ranges(
    cli, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, field: str, value: str, message: str
):
    base = {"runs_on": "[x]", "launcher": "runners/launch_local.sh", "gpus_per_node": "8", "cpu_dram_gb": "8"}
    base[field] = value
    body = "".join(f"  {k}: {v}\n" for k, v in base.items())
    (in_tmp / "runners.yaml").write_text("local:\n" + body + "  container_runtime: none\n")
    monkeypatch.setenv("AGENTSWEEP_RUNNERS", "runners.yaml")
    (in_tmp / "c.yaml").write_text(entry())
    result = cli("--config", "c.yaml", "--key", "k", "--json")
    assert (result.rc, result.err) == (2, f"config error: runners.yaml:{message}\n")


def test_limits_leave_real_configs_alone(cli, in_tmp: Path) -> None:
    """At the limits everything still works: a UTF-8 BOM, tabs and line breaks between engine
    arguments, the largest users/duration/tp, a 100-character key, and anchors reused many times."""
    key = "k" * loader.MAX_KEY_LENGTH
    text = (
        ".shared: &shared {runner: local, engine: sim, precision: fp8, traces: t}\n"
        + f"{key}:\n  <<: *shared\n  model: m\n  duration: 604800\n"
        + '  engine_args: "--a 1\\n\\t--b 2"\n'
        + "  search_space:\n    tp8: {users: [100000]}\n"
    )
    (in_tmp / "c.yaml").write_bytes(b"\xef\xbb\xbf" + text.encode())
    result = cli("--config", "c.yaml", "--key", "k*", "--json")
    assert result.rc == 0, result.err
    assert '"engine_args":"--a 1 --b 2"' in result.out
    assert '"users":100000' in result.out and '"duration":604800' in result.out


def test_config_key_length(cli, in_tmp: Path) -> None:
    (in_tmp / "c.yaml").write_text(entry(key="k" * (loader.MAX_KEY_LENGTH + 1)))
    result = cli("--config", "c.yaml", "--key", "k*", "--json")
    assert result.rc == 2
    assert "config keys are at most 100 characters" in result.err
