"""The README's set-up claims against what the Makefile installs and pyproject.toml declares: each
command's row names exactly the install specs its target passes to pip, the demo installs no test or
lint tool, and every optional part a feature names as an extra exists."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.support.skips import SkipSummary, apt_packages, tier

ROOT = Path(__file__).resolve().parent.parent


def _makefile_specs() -> dict[str, list[str]]:
    """The pip specs of DEMO_INSTALL, TEST_INSTALL and LINT_INSTALL, variables expanded."""
    raw: dict[str, str] = {}
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^(\w+_INSTALL) := (.*)$", line)
        if match:
            raw[match.group(1)] = match.group(2)

    def expand(text: str) -> list[str]:
        text = re.sub(r"\$\((\w+)\)", lambda m: raw[m.group(1)], text)
        return [spec.strip("'") for spec in text.split() if spec != "-e"]

    return {name.removesuffix("_INSTALL").lower(): expand(value) for name, value in raw.items()}


def _readme_rows() -> dict[str, list[str]]:
    """The "installs" table of README's "Two commands": command -> install specs (the leading
    backquoted specs of its row; "the same" stands for the demo's)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Two commands") : text.index("## See a sweep before running it")]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        match = re.match(r"^\| `make (\w+)` \| (.*) \|$", line)
        if not match:
            continue
        command, cell = match.groups()
        specs = re.findall(r"`([^`]+)`", cell.split("(", 1)[0])
        if cell.startswith("the same"):
            specs = rows["demo"] + specs
        rows[command] = specs
    return rows


def test_the_readme_says_what_each_command_installs():
    assert _readme_rows() == _makefile_specs()
    make = (ROOT / "Makefile").read_text()
    for command, stamp in (("demo", "venv"), ("test", "venv-test"), ("lint", "venv-lint")):
        assert re.search(rf"^{command}: {stamp}\b", make, re.M), f"make {command} sets up {stamp}"


def _dependency_names(specs: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0].lower() for spec in specs}


def test_the_demo_installs_no_test_lint_or_optional_part():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _dependency_names(project["dependencies"])
    extras = project["optional-dependencies"]
    for extra in ("test", "lint", "routers", "postgres", "dashboard"):
        own = _dependency_names([s for s in extras[extra] if not s.startswith("agentsweep[")])
        assert not core & own, f"the demo installs {sorted(core & own)} of the {extra} extra"
    replayer = tomllib.loads((ROOT / "kv-cache-tester" / "pyproject.toml").read_text())["project"]
    assert _dependency_names(replayer["dependencies"]) == {"aiohttp"}  # the replayer stays light


def test_every_extra_a_message_names_exists():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = set()
    for path in (ROOT / "utils" / "agentsweep").rglob("*.py"):
        named |= set(re.findall(r"agentsweep\[(\w+)\]", path.read_text()))
    assert named and named <= set(extras)
    assert {"routers", "postgres", "dashboard"} <= named


def test_the_skip_summary_names_tiers_and_the_packages():
    assert "slurm-wlm" in apt_packages() and "chromium" in apt_packages()
    assert tier({"slurm": 1, "slow": 1}) == "slurm" and tier({"integration": 1}) == "integration"
    assert tier({"test_x": 1}) == "unit"
    summary = SkipSummary()
    report = pytest.TestReport(
        nodeid="t.py::x",
        location=("t.py", 1, "x"),
        keywords={"slurm": 1},
        outcome="skipped",
        longrepr=("t.py", 1, "Skipped: slurmctld not installed"),
        when="setup",
    )
    summary.pytest_runtest_logreport(report)
    assert summary.skips == {("slurm", "slurmctld not installed"): 1}
